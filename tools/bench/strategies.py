"""Benchmark of roll.strategies: generation throughput of vLLM vs hf_infer, and weight-sync bandwidth into vLLM.

    ./tools/dev bench strategies              # full run: nano + small generation, small + ~100M weight sync
    ./tools/dev bench strategies --quick      # smoke run: nano only, 8 prompts x 8 tokens, nano sync, 1 rep
    ./tools/dev bench strategies --no-sync    # generation only (or --no-gen: weight sync only)

Generation
    The same tiny model (``make_tiny_causal_lm`` presets "nano", ~0.36M parameters, and "small", ~21M; float32)
    and the same batch on both backends: ``--prompts`` left-padded prompts of 8-24 random tokens, ``--new-tokens``
    tokens each, sampling at temperature 1 with ``ignore_eos`` so every row has the same length. Each backend
    runs in a subprocess of its own (this module with ``--gen-side``): an in-process vLLM engine takes over the
    default torch.distributed group and sets process-wide state, and a fresh process also keeps one backend's
    memory out of the other's numbers. Both use the machine's cores as they choose (torch's default threads for
    HF, vLLM's own OpenMP binding; the threads each ended with are reported). Reported: generated tokens / wall
    seconds of one ``generate`` call, median and best of ``--reps`` after one warm-up call (on a shared machine
    the best repetition is the one least disturbed by other processes), and vllm/hf per model size.

Weight sync
    An ``fsdp2_train`` role (``--train-ranks``, gloo, float32) pushes its weights into ``--receivers`` inference
    workers through :class:`roll.strategies.ModelUpdateGroup` (``--bucket-mb`` buckets) with each of
    ``--transports``: "shared_memory" (a /dev/shm bucket ring read in place), "collective" (gloo broadcast) and
    "object_store" (Ray). Receivers (``--sync-receivers``): "vllm" (the engine as configured by default: on CPU
    each layer is rebuilt and its weights re-packed for oneDNN), "vllm-in-place" (``cpu_plain_linear``: tensors
    copied into the live weights; two engines on the node share one copy, which one of them loads),
    "vllm-in-place-copies" (the same with a copy per engine) and "mock_infer" (loads nothing: the transport alone). All channels of one
    model, receiver kind and transport are alive together (transports one after another): each is synced once
    untimed (setup), then ``--reps`` rounds time one sync of every channel and one memcpy of the same bytes
    (``np.copyto`` into a pre-faulted buffer, in a Ray worker: Ray runs workers at nice 15, so a driver-side copy
    would be an unfair baseline on a loaded machine), so every ratio compares measurements taken under the same
    load of this shared machine. Reported, as medians: the
    whole sync (driver wall clock of ``update()``) and ``transport_s`` (send start to the last bucket readable by
    the last receiver), as GB/s and as a fraction of memcpy, and the phases from the ``weight_sync/*`` metrics:
    gather (full tensors from shards), pack (copies into the bucket slots), send wait (for a free slot), receive
    wait (for a bucket), load (the engine's ``update_weights``), finalize (its post-load processing); per-bucket
    phases go to the RESULT json. Ratios: 2 ranks / 1 rank and 2 receivers / 1 receiver, same receiver and
    transport.

The last stdout line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

import numpy as np

from tools.bench import CACHE_DIR, REPO_ROOT
from tools.bench._measure import environment, measure
from tools.bench._report import add_report_arguments, emit_result, fmt_bytes, fmt_seconds, table
from tools.bench._sides import module_command

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

MODEL_DIR = CACHE_DIR / "bench-strategies"
# A ~100M-parameter variant of "small" for the weight-sync part (make_tiny_causal_lm overrides).
BIG_OVERRIDES = {"hidden_size": 1024, "num_layers": 8, "num_heads": 16, "num_kv_heads": 8, "intermediate_size": 3072}
PAD = 3  # the tiny tokenizer's <|pad|>


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def make_model(name: str) -> tuple[Path, int]:
    """The HF folder of model ``name`` ("nano", "small" or "big") under tools/.cache, and its parameter count."""
    from roll.strategies.testing import make_tiny_causal_lm

    if name == "big":
        path = make_tiny_causal_lm(MODEL_DIR / name, preset="small", overrides=BIG_OVERRIDES)
    else:
        path = make_tiny_causal_lm(MODEL_DIR / name, preset=name)
    return path, int(json.loads((path / "roll_tiny.json").read_text())["num_parameters"])


# --- generation (one backend per subprocess) ---------------------------------------------------------------------
def prompt_batch(num_prompts: int, vocab_size: int, seed: int = 0) -> Any:
    """Left-padded prompts of 8-24 random tokens (ids above the special tokens)."""
    import torch

    from roll.protocol import DataProto

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 25, (num_prompts,), generator=generator).tolist()
    width = max(lengths)
    ids = torch.full((num_prompts, width), PAD, dtype=torch.long)
    mask = torch.zeros((num_prompts, width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(4, vocab_size, (length,), generator=generator)
        mask[row, width - length :] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask})


def generation_side(args: argparse.Namespace) -> None:
    """Subprocess: start ``args.gen_side`` in-process, time ``generate`` on the batch, print RESULT."""
    import torch

    from roll.strategies import GenerationConfig, ModelArgs, StrategyArgs, StrategyWorker, StrategyWorkerConfig

    model = Path(args.model)
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    batch = prompt_batch(args.prompts, vocab_size)
    if args.gen_side == "vllm":
        width = batch.batch["input_ids"].shape[1]
        strategy_config = {"max_model_len": width + args.new_tokens + 8, "kv_cache_space_gb": 2}
    else:
        strategy_config = {"generate_batch_size": args.prompts}  # one generate() call for the whole batch, as vLLM
    config = StrategyWorkerConfig(
        name=args.gen_side,
        model_args=ModelArgs(model_name_or_path=str(model), dtype="float32"),
        strategy_args=StrategyArgs(strategy_name=args.gen_side, strategy_config=strategy_config),
    )
    start = time.perf_counter()
    worker = StrategyWorker(config)
    worker.initialize()
    startup_s = time.perf_counter() - start
    strategy = worker.strategy
    generation = GenerationConfig(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=0)
    expected_tokens = args.prompts * args.new_tokens

    def run() -> int:
        out = strategy.generate(batch, generation)
        tokens = int(out.batch["response_mask"].sum())
        if tokens != expected_tokens:  # ignore_eos must give every row the full length
            raise RuntimeError(f"{args.gen_side} generated {tokens} tokens, expected {expected_tokens}")
        return tokens

    timing = measure(run, reps=args.reps, warmup=1)
    # What the backend ended up computing with (vLLM binds its OpenMP threads itself when the engine starts).
    threads = {"torch_threads": torch.get_num_threads(), "affinity_cpus": len(os.sched_getaffinity(0))}
    strategy.shutdown()
    emit_result(
        {
            "backend": args.gen_side,
            "tokens": expected_tokens,
            "startup_s": startup_s,
            "median_s": timing["median_s"],
            "min_s": timing["min_s"],
            "times_s": timing["times_s"],
            "tokens_per_s": expected_tokens / timing["median_s"],
            # The least disturbed repetition: on a shared machine other processes inflate the others.
            "best_tokens_per_s": expected_tokens / timing["min_s"],
            **threads,
        }
    )


def run_generation_side(backend: str, model: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = module_command(sys.executable, "strategies", "--gen-side", backend, "--model", str(model))
    cmd += ["--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens), "--reps", str(args.reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO_ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{backend} generation side failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def bench_generation(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for size in args.gen_sizes:
        model, params = make_model(size)
        point: dict[str, Any] = {
            "model": size,
            "params": params,
            "prompts": args.prompts,
            "new_tokens": args.new_tokens,
        }
        for backend in ("hf_infer", "vllm"):
            log(f"generation: {size} ({params / 1e6:.2f}M params) on {backend}")
            point[backend] = run_generation_side(backend, model, args)
            log(f"  {point[backend]['tokens_per_s']:.0f} tokens/s")
        point["vllm_over_hf"] = point["vllm"]["tokens_per_s"] / point["hf_infer"]["tokens_per_s"]
        point["vllm_over_hf_best"] = point["vllm"]["best_tokens_per_s"] / point["hf_infer"]["best_tokens_per_s"]
        rows.append(point)
    return rows


# --- weight sync --------------------------------------------------------------------------------------------------
RECEIVERS = {  # bench name -> (backend, strategy_config)
    "vllm": ("vllm", {"max_model_len": 256, "kv_cache_space_gb": 1}),
    "vllm-in-place": ("vllm", {"max_model_len": 256, "kv_cache_space_gb": 1, "cpu_plain_linear": True}),
    # The same engines keeping one copy of the weights each (share_weights_on_node is on by default).
    "vllm-in-place-copies": (
        "vllm",
        {"max_model_len": 256, "kv_cache_space_gb": 1, "cpu_plain_linear": True, "share_weights_on_node": False},
    ),
    "mock_infer": ("mock_infer", {}),
}
PHASES = (
    "gather_s",
    "pack_s",
    "send_wait_s",
    "broadcast_s",
    "receive_wait_s",
    "load_s",
    "finalize_s",
    "transport_s",
    "send_s",
    "receive_s",
    "write_cpu_s",
    "load_cpu_s",
)


def bench_weight_sync(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (train ranks, receivers) channel of one model, receiver kind and transport is alive at once and timed
    round-robin, with a memcpy of the same bytes in each round: ratios compare measurements taken under the same
    machine load (this machine is shared; a slow minute hits every variant alike)."""
    from roll.runtime import ResourceManager
    from roll.runtime.testing import local_ray

    rows = []
    with local_ray(num_cpus=64, log_to_driver=False):  # keep the workers' engine logs out of the table
        resources = ResourceManager()
        for size in args.sync_sizes:
            model, params = make_model(size)
            trainers = {}
            try:
                for ranks in args.train_ranks:
                    log(f"weight sync: {size} ({params / 1e6:.1f}M params): fsdp2_train x{ranks}")
                    trainers[ranks] = start_role(resources, model, "fsdp2_train", {}, ranks)
                for receiver in args.sync_receivers:
                    backend, strategy_config = RECEIVERS[receiver]
                    engines = {}
                    try:
                        for count in args.receivers:
                            log(f"  {count} x {receiver}")
                            engines[count] = start_role(resources, model, backend, strategy_config, count)
                        # One transport's channels at a time: beside live collective channels, shared-memory syncs
                        # measured ~4x slower (docs/results/weight_sync.md, Run D), and a pipeline holds one channel
                        # per pair of roles, never one of each transport.
                        for transport in args.transports:
                            for point in time_channels(trainers, engines, transport, args):
                                rows.append({**point, "model": size, "params": params, "receiver": receiver})
                    finally:
                        for cluster in engines.values():
                            cluster.shutdown()
            finally:
                for cluster in trainers.values():
                    cluster.shutdown()
    add_ratios(rows)
    return rows


def start_role(
    resources, model: Path, strategy: str, strategy_config: dict, world_size: int, devices: list[int] | None = None
):
    """An initialized role of ``world_size`` StrategyWorkers (float32); on CPU, or on GPUs ``devices``."""
    from roll.runtime import Cluster
    from roll.strategies import ModelArgs, StrategyArgs, StrategyWorker, StrategyWorkerConfig
    from roll.strategies.weight_sync import weight_sync_env

    config = StrategyWorkerConfig(
        name=f"bench-{strategy}-{uuid.uuid4().hex[:6]}",
        world_size=world_size,
        device_mapping=devices,
        model_args=ModelArgs(model_name_or_path=str(model), dtype="float32"),
        strategy_args=StrategyArgs(strategy_name=strategy, strategy_config=strategy_config),
        system_envs={"OMP_NUM_THREADS": "1"},
    )
    # The environment pipelines give their workers (Session.worker_env): memcpy settings for weight sync.
    cluster = Cluster(config.name, StrategyWorker, resources, config, env=weight_sync_env())
    try:
        cluster.initialize()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def time_channels(trainers: dict, engines: dict, transport: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from roll.strategies import ModelUpdateGroup

    groups = {
        (ranks, count, transport): ModelUpdateGroup(trainer, engine, bucket_size_mb=args.bucket_mb, transport=transport)
        for ranks, trainer in trainers.items()
        for count, engine in engines.items()
    }
    results: dict[tuple, list[dict[str, Any]]] = {key: [] for key in groups}
    first: dict[tuple, float] = {}
    memcpy: list[tuple[float, float]] = []
    import ray

    copier = None
    try:
        for key, group in groups.items():  # untimed: sets each channel up
            start = time.perf_counter()
            nbytes = int(group.update(0, force=True)["weight_sync/bytes"])
            first[key] = time.perf_counter() - start
        copier = memcpy_actor(nbytes)
        for rep in range(args.reps):
            memcpy.append(ray.get(copier.copy.remote()))
            for key, group in groups.items():
                start = time.perf_counter()
                metrics = group.update(0, force=True)
                metrics["driver_s"] = time.perf_counter() - start
                metrics["buckets_detail"] = group.last_buckets
                results[key].append(metrics)
            log(f"    round {rep + 1}/{args.reps} done")
    finally:
        for group in groups.values():
            group.close()
        if copier is not None:
            ray.kill(copier)
    memcpy_s = statistics.median(wall for wall, _ in memcpy)
    memcpy_cpu_s = statistics.median(cpu for _, cpu in memcpy)
    return [
        {
            **summarize_channel(key, groups[key], results[key], first[key], memcpy_s, args.bucket_mb),
            "memcpy_cpu_s": memcpy_cpu_s,
        }
        for key in groups
    ]


def memcpy_actor(nbytes: int):
    """np.copyto of ``nbytes`` into a pre-faulted buffer, timed in a Ray worker: the sync runs in Ray workers, which
    Ray starts at a lower CPU priority (nice 15) than this driver, so on a loaded machine only a copy made at that
    priority is a fair baseline (on an idle machine both agree)."""
    import ray

    @ray.remote(num_cpus=0)
    class Copier:
        def __init__(self, size: int) -> None:
            self.src = np.ones(size, dtype=np.uint8)
            self.dst = np.zeros(size, dtype=np.uint8)
            np.copyto(self.dst, self.src)  # faults the pages in

        def copy(self) -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.process_time()
            np.copyto(self.dst, self.src)
            return time.perf_counter() - start, time.process_time() - cpu

    copier = cast(Any, Copier).remote(nbytes)  # a ray.remote class
    ray.get(copier.copy.remote())
    return copier


def summarize_channel(key, group, metrics, first_s: float, memcpy_s: float, bucket_mb: float) -> dict[str, Any]:
    """One channel's row: medians over ``metrics`` (one dict per timed sync, with ``driver_s`` and
    ``buckets_detail``), as GB/s and as fractions of a copy of the same bytes taking ``memcpy_s``."""
    ranks, count, transport = key

    def median(name: str) -> float | None:
        values = [m[name] for m in metrics if name in m]
        return statistics.median(values) if values else None

    nbytes = metrics[0]["weight_sync/bytes"]
    seconds, transport_s = median("driver_s"), median("weight_sync/transport_s")
    if seconds is None or transport_s is None:
        raise RuntimeError(f"the sync's metrics lack driver_s or weight_sync/transport_s: {sorted(metrics[0])}")
    memcpy_gbps = nbytes / memcpy_s / 1e9
    point = {
        "train_ranks": ranks,
        "receivers": count,
        "transport": transport,
        "routes": group.routes.describe() if group.routes is not None else "object store",
        "bucket_mb": bucket_mb,
        "buckets": int(metrics[0]["weight_sync/buckets"]),
        "bytes": nbytes,
        "first_sync_s": first_s,
        "seconds": seconds,
        "times_s": [round(m["driver_s"], 4) for m in metrics],
        "gbps": nbytes / seconds / 1e9,
        "transport_gbps": nbytes / transport_s / 1e9,
        "memcpy_s": memcpy_s,
        "memcpy_gbps": memcpy_gbps,
        "fraction_of_memcpy": memcpy_s / seconds,
        "transport_fraction_of_memcpy": memcpy_s / transport_s,
        **{phase: median(f"weight_sync/{phase}") for phase in PHASES},
        "per_bucket": median_buckets([m["buckets_detail"] for m in metrics]),
    }
    log(
        f"    {ranks} rank(s) -> {count} x {transport}: {fmt_bytes(nbytes)} in {fmt_seconds(seconds)} "
        f"({100 * point['fraction_of_memcpy']:.1f}% of memcpy; transport {fmt_seconds(transport_s)}, "
        f"{100 * point['transport_fraction_of_memcpy']:.1f}%)"
    )
    return point


def median_buckets(runs: list[dict[str, list[list[dict[str, float]]]]]) -> list[dict[str, float]]:
    """Per bucket: the median over repetitions of the slowest sender's and slowest receiver's phase times."""
    out: list[dict[str, float]] = []
    if not runs or not runs[0].get("receiver"):
        return out
    for index in range(len(runs[0]["receiver"][0])):
        row: dict[str, float] = {}
        for side in ("sender", "receiver"):
            for key in runs[0][side][0][index] if runs[0][side] and runs[0][side][0] else []:
                row[f"{side}_{key}"] = statistics.median(
                    max(rank[index][key] for rank in run[side] if len(rank) > index) for run in runs
                )
        out.append(row)
    return out


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """2 ranks / 1 rank and N receivers / 1 receiver, same model, receiver backend and transport."""
    index = {(r["model"], r["receiver"], r["receivers"], r["train_ranks"], r["transport"]): r for r in rows}
    for r in rows:
        one_rank = index.get((r["model"], r["receiver"], r["receivers"], 1, r["transport"]))
        one_receiver = index.get((r["model"], r["receiver"], 1, r["train_ranks"], r["transport"]))
        r["vs_1_rank"] = r["seconds"] / one_rank["seconds"] if one_rank else None
        r["vs_1_receiver"] = r["seconds"] / one_receiver["seconds"] if one_receiver else None


# --- report -------------------------------------------------------------------------------------------------------
def report(generation: list[dict[str, Any]], sync: list[dict[str, Any]]) -> None:
    if generation:
        rows = [
            [
                g["model"],
                f"{g['params'] / 1e6:.2f}M",
                f"{g['prompts']} x {g['new_tokens']}",
                f"{g['hf_infer']['tokens_per_s']:.0f}",
                f"{g['vllm']['tokens_per_s']:.0f}",
                f"{g['vllm_over_hf']:.2f}x",
                f"{g['hf_infer']['best_tokens_per_s']:.0f}",
                f"{g['vllm']['best_tokens_per_s']:.0f}",
                f"{g['vllm_over_hf_best']:.2f}x",
                f"{g['hf_infer']['torch_threads']} / {g['vllm']['torch_threads']}",
                f"{g['hf_infer']['startup_s']:.1f} / {g['vllm']['startup_s']:.1f}",
            ]
            for g in generation
        ]
        headers = ["model", "params", "batch", "hf tok/s", "vllm tok/s", "vllm/hf"]
        headers += ["hf best", "vllm best", "best vllm/hf", "threads hf/vllm", "startup s hf/vllm"]
        print("Generation (sampling, temperature 1, ignore_eos; tokens/s of one generate() call: median and best rep)")
        print(table(rows, headers, left=(0, 2)))
        print()
    if sync:

        def secs(value: float | None) -> str:
            return "-" if value is None else fmt_seconds(value)

        def ratio(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}x"

        rows = [
            [
                s["model"],
                f"{s['receivers']} {s['receiver']}",
                s["train_ranks"],
                s["transport"],
                fmt_bytes(s["bytes"]),
                fmt_seconds(s["seconds"]),
                f"{s['gbps']:.2f}",
                f"{100 * s['fraction_of_memcpy']:.1f}%",
                secs(s["transport_s"]),
                f"{100 * s['transport_fraction_of_memcpy']:.1f}%",
                secs(s["gather_s"]),
                secs(s["pack_s"]),
                secs(s["send_wait_s"]),
                secs(s["receive_wait_s"]),
                secs(s["load_s"]),
                secs(s["finalize_s"]),
                f"{secs(s['write_cpu_s'])} / {secs(s['load_cpu_s'])}",
                ratio(s["vs_1_rank"]),
                ratio(s["vs_1_receiver"]),
            ]
            for s in sync
        ]
        headers = ["model", "receivers", "ranks", "transport", "bytes", "sync", "GB/s", "of memcpy"]
        headers += ["transport", "of memcpy", "gather", "pack", "send wait", "recv wait", "load", "finalize"]
        headers += ["cpu write / load"]
        headers += ["/1 rank", "/1 recv"]
        memcpy = ", ".join(sorted({f"{s['memcpy_gbps']:.1f}" for s in sync}))
        memcpy_cpu = ", ".join(sorted({fmt_seconds(s["memcpy_cpu_s"]) for s in sync}))
        print(
            f"Weight sync fsdp2_train -> inference (ModelUpdateGroup, {sync[0]['bucket_mb']} MB buckets; median of "
            f"{len(sync[0]['times_s'])}; memcpy {memcpy} GB/s, {memcpy_cpu} CPU; 'cpu write / load': CPU seconds of "
            "the slowest sender while gathering+packing / of the slowest receiver while loading)"
        )
        print(table(rows, headers, left=(0, 1, 3)))
        print()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_report_arguments(p)
    p.add_argument("--quick", action="store_true", help="smoke run: nano only, 8 prompts x 8 tokens, 1 rep")
    p.add_argument("--gen-sizes", nargs="+", default=None, help="generation models (default: nano small)")
    p.add_argument("--sync-sizes", nargs="+", default=None, help="weight-sync models (default: small big)")
    p.add_argument("--train-ranks", type=int, nargs="+", default=[1, 2], help="fsdp2_train world sizes")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per point")
    p.add_argument("--bucket-mb", type=float, default=64, help="weight-sync bucket size (MB)")
    p.add_argument(
        "--transports",
        nargs="+",
        default=["shared_memory", "collective", "object_store"],
        help="ModelUpdateGroup transports to time",
    )
    p.add_argument("--receivers", type=int, nargs="+", default=[1, 2], help="inference workers receiving one send")
    p.add_argument(
        "--sync-receivers",
        nargs="+",
        default=["vllm-in-place", "vllm", "mock_infer"],
        choices=list(RECEIVERS),
        help="receivers: vllm (the engine's default: layerwise reload + oneDNN repack on CPU), vllm-in-place "
        "(cpu_plain_linear: one copy per tensor; engines on one node share one copy of the weights), "
        "vllm-in-place-copies (the same, each engine with its own copy), mock_infer (transport only: loads nothing)",
    )
    p.add_argument("--no-gen", action="store_true", help="skip the generation part")
    p.add_argument("--no-sync", action="store_true", help="skip the weight-sync part")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per generation subprocess")
    # Internal: run one backend's generation in this (sub)process.
    p.add_argument("--gen-side", choices=["hf_infer", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.reps = 8, 8, 1
        args.gen_sizes = args.gen_sizes or ["nano"]
        args.sync_sizes = args.sync_sizes or ["nano"]
        args.bucket_mb = 1
    args.gen_sizes = args.gen_sizes or ["nano", "small"]
    args.sync_sizes = args.sync_sizes or ["small", "big"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.gen_side:
        generation_side(args)
        return
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    generation = [] if args.no_gen else bench_generation(args)
    sync = [] if args.no_sync else bench_weight_sync(args)
    report(generation, sync)
    emit_result(
        {
            "benchmark": "strategies",
            "quick": args.quick,
            "generation": [
                {
                    "model": g["model"],
                    "params": g["params"],
                    "prompts": g["prompts"],
                    "new_tokens": g["new_tokens"],
                    "hf_tokens_per_s": g["hf_infer"]["tokens_per_s"],
                    "vllm_tokens_per_s": g["vllm"]["tokens_per_s"],
                    "vllm_over_hf": g["vllm_over_hf"],
                    "vllm_over_hf_best": g["vllm_over_hf_best"],
                    "hf": g["hf_infer"],
                    "vllm": g["vllm"],
                }
                for g in generation
            ],
            "weight_sync": sync,
            "wall_s": time.perf_counter() - started,
            "env": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
