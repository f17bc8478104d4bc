"""The verl half of tools/bench/dispatch.py: the same calls through verl 0.9.1's RayWorkerGroup.

Run by dispatch.py with the python of the verl venv (tools/.cache/venv-verl), never by hand in the roll venv:
it imports verl at module level. It starts its own local Ray, times

* ``noop``: a ``Dispatch.ONE_TO_ALL`` method with no arguments that returns None, alternating round by round
  with the same no-op on N plain Ray actors (``raw_noop``), the reference that lets the main bench compare verl's
  no-op with roll's independently of the machine's load in each process, and
* an identity ``Dispatch.DP_COMPUTE_PROTO`` method on a verl DataProto of each payload size,

for each worker count, and prints ``RESULT {json}`` as its last stdout line. A failure at one worker count is
recorded in the JSON (``errors``) and the other counts still run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import ray
import torch
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

from tools.bench._measure import freeze_heap, gc_disabled, measure, peak_rss_mib, summarize
from tools.bench._report import emit_result


class VerlBenchWorker(Worker):
    """A verl worker with the two benchmarked methods."""

    def __init__(self) -> None:
        super().__init__()
        torch.set_num_threads(1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def identity(self, data: DataProto) -> DataProto:
        return data


class RawActor:
    """A plain Ray actor with the same no-op: the in-process reference for verl's no-op (see dispatch.py)."""

    def ready(self) -> int:
        return os.getpid()

    def noop(self) -> None:
        return None


def alternate(fns: dict[str, Callable[[], Any]], reps: int, warmup: int) -> dict[str, list[float]]:
    """Time the functions round by round, alternating their order (as dispatch.py does for roll and raw Ray)."""
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
    return times


def make_batch(rows: int, nbytes: int) -> DataProto:
    """One float32 tensor of ``rows`` rows and ``nbytes`` bytes in all (0 bytes: a zero-width tensor)."""
    width = nbytes // (4 * rows)
    return DataProto.from_dict(tensors={"x": torch.ones((rows, width), dtype=torch.float32)})


def log(msg: str) -> None:
    print(f"  [verl] {msg}", file=sys.stderr, flush=True)


def bench_world(
    n: int, batches: dict[str, DataProto], raw_actors: list[Any], args: argparse.Namespace
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    pool = RayResourcePool([n], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(VerlBenchWorker)), device_name="cpu")
    try:
        group.noop()  # every worker is up once it answers
        out["start_s"] = time.perf_counter() - t0
        actors = raw_actors[:n]
        times = alternate(
            {"verl": group.noop, "raw": lambda: ray.get([a.noop.remote() for a in actors])}, args.reps_noop, args.warmup
        )
        out["noop"], out["raw_noop"] = summarize(times["verl"]), summarize(times["raw"])
        for name, batch in batches.items():
            back = group.identity(batch)
            if len(back) != len(batch) or not torch.equal(back.batch["x"], batch.batch["x"]):
                raise AssertionError(f"identity on {name} did not return the batch")
            del back
            reps = args.reps_large if batch.batch["x"].nbytes >= args.large_bytes else args.reps
            out[name] = measure(lambda batch=batch: group.identity(batch), reps=reps, warmup=max(0, args.warmup - 1))
    finally:
        for handle in group.workers:
            ray.kill(handle, no_restart=True)
        for pg in pool.pgs or []:
            ray.util.remove_placement_group(pg)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", required=True)
    p.add_argument("--payloads", required=True, help='JSON object {"name": tensor bytes, ...}')
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--reps-noop", type=int, required=True)
    p.add_argument("--reps-large", type=int, required=True)
    p.add_argument("--large-bytes", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--num-cpus", type=int, required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    payloads = {str(k): int(v) for k, v in json.loads(args.payloads).items()}

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    result: dict[str, Any] = {"ray_init_s": time.perf_counter() - t0, "points": {}, "errors": {}}
    try:
        import verl

        result["version"] = getattr(verl, "__version__", "?")
        batches = {name: make_batch(args.rows, nbytes) for name, nbytes in payloads.items()}
        freeze_heap()
        raw_actors: list[Any] = [ray.remote(RawActor).options(num_cpus=0.01).remote() for _ in range(max(args.workers))]
        ray.get([a.ready.remote() for a in raw_actors])
        for n in args.workers:
            log(f"N={n}")
            try:
                result["points"][str(n)] = bench_world(n, batches, raw_actors, args)
            except Exception as e:
                result["errors"][str(n)] = f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stderr)
    finally:
        ray.shutdown()
    result["peak_rss_mib"] = peak_rss_mib()
    emit_result(result)


if __name__ == "__main__":
    main()
