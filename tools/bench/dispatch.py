"""Round-trip latency of a cluster call: roll's Cluster vs plain Ray actors vs verl's RayWorkerGroup.

    ./tools/dev bench dispatch                 # full run: N = 1, 2, 4, 8 CPU workers, 0 B / 1 MiB / 64 MiB, verl
    ./tools/dev bench dispatch --quick         # smoke run: N = 1, 2; 0 B and 64 KiB; few reps; no verl
    ./tools/dev bench dispatch --workers 8 --payloads 1MiB --no-verl --profile

Two calls are timed for each worker count N, from the driver, blocking, after warm-up:

* ``noop``: a ``Dispatch.ONE_TO_ALL`` method with no arguments that returns None on every rank;
* ``identity``: a ``Dispatch.DP_MP_COMPUTE`` method that returns the shard it was given, on a DataProto of
  ``--rows`` rows holding one float32 tensor of 0 B (zero width), 1 MiB or 64 MiB; the caller gets the whole
  batch back (shards concatenated).

Three systems, in the same run:

* roll: a :class:`roll.runtime.Cluster` of a Worker subclass (``cluster.noop()``, ``cluster.identity(batch)``);
* raw Ray: N plain Ray actors with the same resources, fan-out ``.remote()`` then one ``ray.get``; for identity
  the caller does ``batch.chunk(N)``, one call per chunk and ``DataProto.concat`` of the results: the same work
  without roll's dispatch machinery. roll and raw Ray are timed alternately, round by round (ABBA order), so
  that a change in the machine's load hits both;
* verl 0.9.1: ``RayWorkerGroup`` on ``RayResourcePool([N], use_gpu=False)``, ``ONE_TO_ALL`` no-op and
  ``DP_COMPUTE_PROTO`` identity on verl's DataProto, run afterwards by ``_verl_dispatch_side.py`` in the verl venv
  (tools/.cache/venv-verl, created on first use) with its own Ray. If verl cannot run, the error is recorded and
  the rest of the report stands.

Rounds: 200 for the no-op (cheap, and its ratios are the noisiest), 30 for 0 B and 1 MiB, 20 for 64 MiB (10 for
verl, whose 64 MiB call takes about a second), each after warm-up.

Reported per point: median and p90 of each system, roll/raw and roll/verl (median) ratios and the number of
``ray.put`` calls roll made for the call (``Cluster.last_call_stats``; the object-store copies Ray makes by itself
for arguments over its inline limit are not counted, and are the same for raw Ray). Targets: roll within 1.25x of
raw Ray at every point, and no slower than verl at every point (strictly, on medians; the points slower by more
than 5% are listed besides). A point whose roll/raw ratio misses the target is measured a second time with as
many rounds and judged on the pooled rounds (both ratios are kept in the RESULT), so that one burst of load on a
shared machine does not decide it. verl runs in another process at another time, so its no-op is also compared
through plain actors timed alternately with it: (roll/raw) / (verl/raw), the "(norm.)" column. The last stdout
line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tools.bench._measure import environment, freeze_heap, gc_disabled, peak_rss_mib, summarize
from tools.bench._report import add_report_arguments, emit_result, fmt_bytes, fmt_seconds, table
from tools.bench._sides import run_verl_side

# Ray, torch and roll.runtime are imported when the benchmark runs (the workers and raw-Ray calls are in
# _dispatch_parts.py), so that --help answers at once
if TYPE_CHECKING:
    from roll.runtime import Cluster, DataProto, ResourceManager

RAY_CPUS = 32  # logical CPUs of the embedded Ray: room for 8 + 8 small actors
TARGET_VS_RAW = 1.25  # roll median <= 1.25 x raw Ray median at every point
TARGET_VS_VERL = 1.0  # roll median <= verl median at every point
TIE_VS_VERL = 1.05  # reported besides: points where roll is slower than verl by more than run-to-run noise
MiB = 1 << 20
FULL_PAYLOADS = {"0B": 0, "1MiB": MiB, "64MiB": 64 * MiB}
QUICK_PAYLOADS = {"0B": 0, "64KiB": 64 << 10}
# A verl worker group reserves max_colocate_count (10 by default) logical CPUs per worker in its placement group.
VERL_CPUS_PER_WORKER = 10


# --- timing ---------------------------------------------------------------------------------------------------
def alternate(fns: dict[str, Callable[[], Any]], reps: int, warmup: int) -> dict[str, list[float]]:
    """Time each function ``reps`` times after ``warmup`` untimed rounds, alternating them round by round (the
    order flips every round: A B, B A, ...). ``gc.collect()`` runs before each call and the collector is off
    during it, as in ``_common.measure``."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + reps):
        for name in names if i % 2 == 0 else names[::-1]:
            gc.collect()
            with gc_disabled():
                t0 = time.perf_counter()
                out = fns[name]()
                elapsed = time.perf_counter() - t0
            del out
            if i >= warmup:
                times[name].append(elapsed)
    gc.collect()
    return times


class RollCalls:
    """Calls a roll cluster method and records ``last_call_stats["object_store_puts"]`` of every call."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.puts: list[int] = []

    def call(self, method: str, *args: Any) -> Any:
        out = getattr(self.cluster, method)(*args)
        self.puts.append(int(self.cluster.last_call_stats.get("object_store_puts", -1)))
        return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def measure_point(
    op: str, roll_fn: Callable[[], Any], raw_fn: Callable[[], Any], calls: RollCalls, reps: int, warmup: int, log
) -> dict[str, Any]:
    """roll vs raw Ray at one point; measured again (rounds pooled) if the roll/raw median misses the target."""
    calls.puts.clear()
    times = alternate({"roll": roll_fn, "raw": raw_fn}, reps, warmup)
    first = _ratio(summarize(times["roll"])["median_s"], summarize(times["raw"])["median_s"])
    point: dict[str, Any] = {"first_roll_over_raw": first}
    if first is not None and first > TARGET_VS_RAW:
        log(f"    {op}: roll/raw {first:.2f}x > {TARGET_VS_RAW}x, measuring the point again")
        again = alternate({"roll": roll_fn, "raw": raw_fn}, reps, 1)
        point["rerun_roll_over_raw"] = _ratio(summarize(again["roll"])["median_s"], summarize(again["raw"])["median_s"])
        times = {k: times[k] + again[k] for k in times}
    point["roll"], point["raw"] = summarize(times["roll"]), summarize(times["raw"])
    point["roll_over_raw"] = _ratio(point["roll"]["median_s"], point["raw"]["median_s"])
    point["roll_over_raw_p90"] = _ratio(point["roll"]["p90_s"], point["raw"]["p90_s"])
    point["roll_puts_per_call"] = max(calls.puts) if calls.puts else None
    return point


def profile_roll(fn: Callable[[], Any], calls: int, top: int = 18) -> str:
    """cProfile of the driver over ``calls`` roll calls: the functions with the most own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


# --- roll and raw Ray -----------------------------------------------------------------------------------------
def bench_world(
    n: int,
    batches: dict[str, DataProto],
    resources: ResourceManager,
    all_actors: list[Any],
    args: argparse.Namespace,
    log,
) -> dict[str, Any]:
    """roll's Cluster of ``n`` workers vs the first ``n`` of the raw actors (started once for every N)."""
    import torch

    from roll.runtime import Cluster, WorkerConfig
    from tools.bench._dispatch_parts import RollBenchWorker, raw_identity, raw_noop

    out: dict[str, Any] = {"ops": {}}
    t0 = time.perf_counter()
    cluster = Cluster(f"dispatch-bench-{n}", RollBenchWorker, resources, WorkerConfig(name="bench", world_size=n))
    cluster.noop()
    out["roll_start_s"] = time.perf_counter() - t0
    actors = all_actors[:n]
    calls = RollCalls(cluster)
    try:
        log(f"  N={n}: noop")
        out["ops"]["noop"] = measure_point(
            "noop",
            lambda: calls.call("noop"),
            lambda: raw_noop(actors),
            calls,
            args.reps_noop,
            args.warmup,
            log,
        )
        for name, batch in batches.items():
            log(f"  N={n}: identity {name}")
            for label, back in (("roll", cluster.identity(batch)), ("raw", raw_identity(actors, batch))):
                if len(back) != len(batch) or not torch.equal(back.batch["x"], batch.batch["x"]):
                    raise AssertionError(f"{label} identity on {name} did not return the batch")
            large = batch.batch["x"].nbytes >= args.large_bytes
            out["ops"][name] = measure_point(
                name,
                functools.partial(calls.call, "identity", batch),
                functools.partial(raw_identity, actors, batch),
                calls,
                args.reps_large if large else args.reps,
                max(1, args.warmup - 1) if large else args.warmup,
                log,
            )
        if args.profile:
            profiled: list[tuple[str, DataProto | None]] = [("noop", None), *batches.items()]
            for name, one in profiled:
                fn = cluster.noop if one is None else functools.partial(cluster.identity, one)
                k = 5 if one is not None and one.batch["x"].nbytes >= args.large_bytes else 200
                text = profile_roll(fn, k)
                print(f"\n--- cProfile of the driver, {k} roll calls, N={n}, {name} ---\n{text}", file=sys.stderr)
    finally:
        cluster.shutdown()
    return out


# --- verl -----------------------------------------------------------------------------------------------------
def run_verl(args: argparse.Namespace, payloads: dict[str, int], log) -> dict[str, Any]:
    side_args = [
        *("--workers", *map(str, args.workers)),
        *("--payloads", json.dumps(payloads), "--rows", str(args.rows)),
        *("--reps", str(args.reps), "--reps-noop", str(args.reps_noop), "--reps-large", str(args.reps_large_verl)),
        *("--large-bytes", str(args.large_bytes)),
        *("--warmup", str(args.warmup), "--threads", str(args.threads)),
        *("--num-cpus", str(VERL_CPUS_PER_WORKER * max(args.workers) + 8)),
    ]
    return run_verl_side("_verl_dispatch_side", side_args, timeout_s=args.verl_timeout, log=log)


# --- report ---------------------------------------------------------------------------------------------------
def _fx(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def build_points(
    roll_raw: dict[str, Any], verl: dict[str, Any], ops: list[str], workers: list[int], payloads: dict[str, int]
) -> list[dict[str, Any]]:
    points = []
    for op in ops:
        for n in workers:
            world = roll_raw.get(str(n), {}).get("ops", {})
            if op not in world:
                continue
            p = dict(world[op])
            verl_world = verl.get("points", {}).get(str(n), {})
            p["verl"] = verl_world.get(op)
            p["roll_over_verl"] = _ratio(p["roll"]["median_s"], p["verl"]["median_s"]) if p["verl"] else None
            if op == "noop" and p["verl"] and verl_world.get("raw_noop"):
                # verl's no-op alternated with plain actors in its own process: compare the two overheads over
                # raw Ray, each measured under the same load as its reference.
                p["verl_raw_noop"] = verl_world["raw_noop"]
                p["verl_over_raw"] = _ratio(p["verl"]["median_s"], verl_world["raw_noop"]["median_s"])
                p["roll_over_verl_raw_normalized"] = _ratio(p["roll_over_raw"], p["verl_over_raw"])
            p["op"], p["n"] = op, n
            p["call"] = "noop (ONE_TO_ALL)" if op == "noop" else f"identity {op} (DP_MP_COMPUTE)"
            p["tensor_bytes"] = None if op == "noop" else payloads[op]
            points.append(p)
    return points


def report_table(points: list[dict[str, Any]]) -> str:
    rows = []
    for p in points:
        v = p["verl"] or {}
        rerun = f" (1st {p['first_roll_over_raw']:.2f}x)" if "rerun_roll_over_raw" in p else ""
        rows.append(
            [
                p["call"],
                p["n"],
                fmt_seconds(p["roll"]["median_s"]),
                fmt_seconds(p["roll"]["p90_s"]),
                fmt_seconds(p["raw"]["median_s"]),
                fmt_seconds(p["raw"]["p90_s"]),
                fmt_seconds(v.get("median_s")),
                fmt_seconds(v.get("p90_s")),
                _fx(p["roll_over_raw"]) + rerun,
                _fx(p["roll_over_verl"]),
                _fx(p.get("roll_over_verl_raw_normalized")),
                "-" if p["roll_puts_per_call"] is None else p["roll_puts_per_call"],
            ]
        )
    headers = [
        "call",
        "N",
        "roll med",
        "roll p90",
        "raw med",
        "raw p90",
        "verl med",
        "verl p90",
        "roll/raw",
        "roll/verl",
        "(norm.)",
        "roll puts",
    ]
    return table(rows, headers)


def targets_of(points: list[dict[str, Any]], verl_ran: bool) -> dict[str, Any]:
    vs_raw = [p["roll_over_raw"] for p in points if p["roll_over_raw"] is not None]
    vs_verl = [p["roll_over_verl"] for p in points]
    raw_miss = [f"{p['op']}@N={p['n']}" for p in points if (p["roll_over_raw"] or 0) > TARGET_VS_RAW]
    verl_miss = [f"{p['op']}@N={p['n']}" for p in points if (p["roll_over_verl"] or 0) > TARGET_VS_VERL]
    verl_complete = verl_ran and bool(points) and all(x is not None for x in vs_verl)

    def normalized(p: dict[str, Any]) -> float | None:
        return p.get("roll_over_verl_raw_normalized", p["roll_over_verl"])

    norm_miss = [f"{p['op']}@N={p['n']}" for p in points if (normalized(p) or 0) > TARGET_VS_VERL]
    clear_miss = [f"{p['op']}@N={p['n']}" for p in points if (p["roll_over_verl"] or 0) > TIE_VS_VERL]
    return {
        "within_1.25x_of_raw_ray_at_every_point": bool(vs_raw) and not raw_miss,
        "no_slower_than_verl_at_every_point": (not verl_miss) if verl_complete else None,
        "no_slower_than_verl_at_every_point_noop_raw_normalized": (not norm_miss) if verl_complete else None,
        "worst_roll_over_raw": max(vs_raw) if vs_raw else None,
        "worst_roll_over_verl": max((x for x in vs_verl if x is not None), default=None),
        "points_over_1.25x_raw": raw_miss,
        "points_slower_than_verl": verl_miss,
        "points_slower_than_verl_noop_raw_normalized": norm_miss,
        "points_slower_than_verl_by_more_than_5pct": clear_miss,
        "verl_points_missing": [f"{p['op']}@N={p['n']}" for p in points if p["roll_over_verl"] is None],
        "judged_on": "medians. roll and raw Ray alternate round by round in one process; verl runs afterwards in "
        "its own process and Ray. The _raw_normalized variant compares the no-op as (roll/raw) / (verl/raw), each "
        "ratio from one process where the two calls alternate, so the load of each phase cancels out",
    }


def _drop_raw_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_raw_times(v) for k, v in value.items() if k != "times_s"}
    if isinstance(value, list):
        return [_drop_raw_times(v) for v in value]
    return value


# --- main -----------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_report_arguments(p)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], help="worker counts N")
    p.add_argument("--payloads", nargs="+", default=None, help=f"identity payloads (default {' '.join(FULL_PAYLOADS)})")
    p.add_argument("--rows", type=int, default=64, help="rows of the batch (a multiple of every N)")
    p.add_argument("--reps", type=int, default=30, help="timed rounds per point (identity payloads)")
    p.add_argument(
        "--reps-noop", type=int, default=200, help="timed rounds of the no-op (cheap; its ratios are the noisiest)"
    )
    p.add_argument("--reps-large", type=int, default=20, help="timed rounds for payloads >= --large-bytes")
    p.add_argument(
        "--reps-large-verl",
        type=int,
        default=10,
        help="verl's rounds for payloads >= --large-bytes (about 1 s each at 64 MiB)",
    )
    p.add_argument("--large-bytes", type=int, default=16 * MiB)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads of the driver (actors use 1)")
    p.add_argument("--quick", action="store_true", help="smoke run: N = 1, 2; 0 B and 64 KiB; 3 reps; no verl")
    p.add_argument("--no-verl", action="store_true", help="skip verl")
    p.add_argument("--verl-timeout", type=float, default=900.0)
    p.add_argument("--profile", action="store_true", help="print a cProfile of roll calls (driver side) to stderr")
    p.add_argument("--raw-times", action="store_true", help="keep every round's time in the RESULT json")
    args = p.parse_args(argv)
    payloads = dict(QUICK_PAYLOADS if args.quick else FULL_PAYLOADS)
    if args.quick:
        args.workers, args.reps, args.reps_noop, args.reps_large, args.warmup = [1, 2], 3, 5, 2, 1
        args.reps_large_verl = 2
        args.no_verl = True
    if args.payloads:
        known = {**FULL_PAYLOADS, **QUICK_PAYLOADS}
        unknown = [name for name in args.payloads if name not in known]
        if unknown:
            p.error(f"unknown payloads {unknown}; choose from {sorted(known)}")
        payloads = {name: known[name] for name in args.payloads}
    args.payload_bytes = payloads
    bad = [n for n in args.workers if n < 1 or args.rows % n]
    if bad:
        p.error(f"--rows {args.rows} must be a multiple of every N (verl's DP_COMPUTE_PROTO pads otherwise): {bad}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    import roll.runtime
    from roll.runtime import ResourceManager, WorkerConfig
    from tools.bench._dispatch_parts import make_batch, start_raw_actors

    torch.set_num_threads(args.threads)
    wall0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"  {time.perf_counter() - wall0:7.1f}s {msg}", file=sys.stderr, flush=True)

    payloads: dict[str, int] = args.payload_bytes
    t0 = time.perf_counter()
    roll.runtime.init(num_cpus=RAY_CPUS, log_to_driver=False)
    ray_init_s = time.perf_counter() - t0
    batches = {name: make_batch(args.rows, nbytes) for name, nbytes in payloads.items()}
    freeze_heap()
    roll_raw: dict[str, Any] = {}
    try:
        resources = ResourceManager()
        log(f"[raw Ray] starting {max(args.workers)} actors")
        t0 = time.perf_counter()
        actors = start_raw_actors(max(args.workers))
        raw_start_s = time.perf_counter() - t0
        for n in args.workers:
            log(f"[roll + raw Ray] N={n}")
            roll_raw[str(n)] = bench_world(n, batches, resources, actors, args, log)
    finally:
        roll.runtime.shutdown()
    del batches
    gc.collect()

    if args.no_verl:
        verl: dict[str, Any] = {"error": "skipped (--no-verl / --quick)"}
    else:
        log("[verl] side benchmark in its own venv and Ray")
        verl = run_verl(args, payloads, log)
    verl_ran = "error" not in verl
    if verl_ran and verl.get("errors"):
        verl["error"] = "; ".join(f"N={n}: {e}" for n, e in verl["errors"].items())

    ops = ["noop", *payloads]
    points = build_points(roll_raw, verl, ops, args.workers, payloads)
    targets = targets_of(points, verl_ran)

    print(
        f"roll.runtime dispatch benchmark: round-trip latency of blocking calls from the driver, {args.rows}-row "
        f"DataProto of one float32 tensor; medians of {args.reps_noop} (noop) / {args.reps} / {args.reps_large} "
        f"(>= {fmt_bytes(args.large_bytes)}; verl {args.reps_large_verl}) rounds after warm-up; "
        f"load avg {environment()['loadavg']}"
    )
    print()
    print(report_table(points))
    if "error" in verl:
        print(f"(verl: {verl['error']})")
    print()
    starts = []
    for n in args.workers:
        vs = verl.get("points", {}).get(str(n), {}).get("start_s")
        starts.append([n, fmt_seconds(roll_raw.get(str(n), {}).get("roll_start_s")), fmt_seconds(vs)])
    print(table(starts, ["N", "roll Cluster start", "verl group start"]))
    print(
        f"(start = creation until a first no-op returns; {max(args.workers)} raw actors, shared by every N, "
        f"started in {fmt_seconds(raw_start_s)}; (norm.) = no-op (roll/raw) / (verl/raw), see RESULT targets)"
    )
    print()
    status = {True: "MET", False: "MISSED", None: "n/a"}
    t_raw, t_verl = targets["within_1.25x_of_raw_ray_at_every_point"], targets["no_slower_than_verl_at_every_point"]
    print(
        f"target roll <= {TARGET_VS_RAW}x raw Ray at every point: {status[t_raw]} "
        f"(worst {_fx(targets['worst_roll_over_raw'])}"
        + (f"; over: {', '.join(targets['points_over_1.25x_raw'])}" if targets["points_over_1.25x_raw"] else "")
        + ")"
    )
    print(
        f"target roll no slower than verl at every point: {status[t_verl]} "
        f"(worst {_fx(targets['worst_roll_over_verl'])}"
        + (f"; slower: {', '.join(targets['points_slower_than_verl'])}" if targets["points_slower_than_verl"] else "")
        + ")"
    )
    t_norm = targets["no_slower_than_verl_at_every_point_noop_raw_normalized"]
    norm_miss = targets["points_slower_than_verl_noop_raw_normalized"]
    print(
        f"  same, no-op compared as (roll/raw) / (verl/raw): {status[t_norm]}"
        + (f" (slower: {', '.join(norm_miss)})" if norm_miss else "")
    )
    clear = targets["points_slower_than_verl_by_more_than_5pct"]
    print(f"  points where roll is slower than verl by more than 5%: {', '.join(clear) if clear else 'none'}")
    if args.quick:
        print("(--quick: tiny sizes and few rounds; this run only checks that the bench works)")

    result = {
        "config": {
            "workers": args.workers,
            "payloads": payloads,
            "rows": args.rows,
            "reps": args.reps,
            "reps_noop": args.reps_noop,
            "reps_large": args.reps_large,
            "reps_large_verl": args.reps_large_verl,
            "large_bytes": args.large_bytes,
            "warmup": args.warmup,
            "threads": args.threads,
            "quick": args.quick,
            "ray_cpus": RAY_CPUS,
            "roll_num_cpus_per_worker": WorkerConfig().num_cpus_per_worker,
        },
        "env": environment(),
        "ray_init_s": ray_init_s,
        "points": points,
        "starts": {
            "raw_actors_s": raw_start_s,
            "roll_cluster_s": {n: w.get("roll_start_s") for n, w in roll_raw.items()},
            "verl_group_s": {n: w.get("start_s") for n, w in verl.get("points", {}).items()},
        },
        "verl": {k: v for k, v in verl.items() if k != "points"},
        "targets": targets,
        "peak_rss_mib": peak_rss_mib(),
        "wall_s": time.perf_counter() - wall0,
    }
    emit_result(result if args.raw_times else _drop_raw_times(result), args.result_file)


if __name__ == "__main__":
    main()
