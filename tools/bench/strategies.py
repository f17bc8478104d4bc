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
    An ``fsdp2_train`` role (1 and 2 ranks, gloo, float32) pushes its weights into a 1-worker ``vllm`` role through
    :class:`roll.strategies.ModelUpdateGroup` (``--bucket-mb`` buckets), with both transports: "collective" (a
    dedicated gloo group) and "object_store" (Ray). One untimed sync sets the channel up, then ``--reps`` syncs are
    timed. Bandwidth = bytes synced / driver wall seconds of ``update()``, reported as GB/s and as a fraction of
    memcpy bandwidth of the same bytes (``np.copyto`` into a pre-faulted buffer, measured in this run). The
    breakdown comes from the metrics ``update()`` returns: ``send_s`` (sender: gather full tensors from the shards,
    pack, broadcast; collective only) and ``receive_s`` (receiver: receive and load into the engine).

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
from typing import Any

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
def memcpy_gbps(nbytes: int, reps: int) -> float:
    """np.copyto of ``nbytes`` into a buffer whose pages are already faulted in: GB/s (median)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # zeros() maps lazily; the warm-up copy faults the pages in
    timing = measure(lambda: np.copyto(dst, src), reps=max(reps, 3), warmup=1)
    return nbytes / timing["median_s"] / 1e9


def bench_weight_sync(args: argparse.Namespace) -> list[dict[str, Any]]:
    from roll.runtime import Cluster, ResourceManager
    from roll.runtime.testing import local_ray
    from roll.strategies import ModelArgs, StrategyArgs, StrategyWorker, StrategyWorkerConfig

    def role(model: Path, name: str, strategy: str, world_size: int, strategy_config: dict) -> StrategyWorkerConfig:
        return StrategyWorkerConfig(
            name=f"{name}-{uuid.uuid4().hex[:6]}",
            world_size=world_size,
            model_args=ModelArgs(model_name_or_path=str(model), dtype="float32"),
            strategy_args=StrategyArgs(strategy_name=strategy, strategy_config=strategy_config),
            system_envs={"OMP_NUM_THREADS": "1"},
        )

    rows = []
    with local_ray(num_cpus=64, log_to_driver=False):  # keep the workers' engine logs out of the table
        resources = ResourceManager()
        for size in args.sync_sizes:
            model, params = make_model(size)
            log(f"weight sync: {size} ({params / 1e6:.1f}M params): starting the vllm role")
            infer_config = role(model, "bench-rollout", "vllm", 1, {"max_model_len": 256, "kv_cache_space_gb": 1})
            infer = Cluster(infer_config.name, StrategyWorker, resources, infer_config)
            try:
                infer.initialize()
                for ranks in args.train_ranks:
                    log(f"  fsdp2_train x{ranks}")
                    train_config = role(model, "bench-train", "fsdp2_train", ranks, {})
                    train = Cluster(train_config.name, StrategyWorker, resources, train_config)
                    try:
                        train.initialize()
                        for transport in ("collective", "object_store"):
                            rows.append(sync_point(train, infer, size, params, ranks, transport, args))
                    finally:
                        train.shutdown()
            finally:
                infer.shutdown()
    memcpy: dict[int, float] = {}
    for row in rows:  # after the clusters are gone, so the copies do not compete with them for the cores
        nbytes = int(row["bytes"])
        if nbytes not in memcpy:
            memcpy[nbytes] = memcpy_gbps(nbytes, args.reps)
        row["memcpy_gbps"] = memcpy[nbytes]
        row["fraction_of_memcpy"] = row["gbps"] / memcpy[nbytes]
    return rows


def sync_point(train, infer, size: str, params: int, ranks: int, transport: str, args) -> dict[str, Any]:
    from roll.strategies import ModelUpdateGroup

    group = ModelUpdateGroup(train, infer, bucket_size_mb=args.bucket_mb, transport=transport)
    try:
        start = time.perf_counter()
        group.update(0, force=True)  # sets the channel up
        setup_s = time.perf_counter() - start
        metrics = []
        for _ in range(args.reps):
            start = time.perf_counter()
            result = group.update(0, force=True)
            result["driver_s"] = time.perf_counter() - start
            metrics.append(result)
    finally:
        group.close()

    def median(key: str) -> float | None:
        values = [m[key] for m in metrics if key in m]
        return statistics.median(values) if values else None

    nbytes = metrics[0]["weight_sync/bytes"]
    seconds = median("driver_s")
    point = {
        "model": size,
        "params": params,
        "train_ranks": ranks,
        "transport": group.transport,
        "bucket_mb": args.bucket_mb,
        "bytes": nbytes,
        "first_sync_s": setup_s,
        "seconds": seconds,
        "times_s": [round(m["driver_s"], 4) for m in metrics],
        "gbps": nbytes / seconds / 1e9,
        "send_s": median("weight_sync/send_s"),
        "receive_s": median("weight_sync/receive_s"),
    }
    log(f"    {transport}: {fmt_bytes(nbytes)} in {fmt_seconds(seconds)} = {point['gbps']:.2f} GB/s")
    return point


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

        rows = [
            [
                s["model"],
                f"{s['params'] / 1e6:.1f}M",
                s["train_ranks"],
                s["transport"],
                fmt_bytes(s["bytes"]),
                fmt_seconds(s["seconds"]),
                f"{s['gbps']:.3f}",
                f"{s['memcpy_gbps']:.2f}",
                f"{100 * s['fraction_of_memcpy']:.1f}%",
                secs(s["send_s"]),
                secs(s["receive_s"]),
            ]
            for s in sync
        ]
        headers = ["model", "params", "ranks", "transport", "bytes", "sync", "GB/s", "memcpy GB/s", "of memcpy"]
        headers += ["send_s", "receive_s"]
        print(f"Weight sync fsdp2_train -> vllm (ModelUpdateGroup, {sync[0]['bucket_mb']} MB buckets; median)")
        print(table(rows, headers, left=(0, 3)))
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
    p.add_argument("--bucket-mb", type=int, default=64, help="weight-sync bucket size (MB)")
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
