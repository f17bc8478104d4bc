"""Benchmark of the distillation logits transfer (teacher top-k -> student), with memcpy measured in the same run.

    python -m tools.bench.distill_logits                     # 4096 rows x 2048 tokens, k = 64
    python -m tools.bench.distill_logits --quick             # smoke run: 64 x 256 tokens
    python -m tools.bench.distill_logits --rows 1024 --seq 512 --k 64 --result-file out.json

What moves is what the distill pipeline moves: per distilled token, k token ids (uint16 for vocabularies up to
65536) and k float32 log-probs, packed by ``roll.pipelines.distill.transfer.pack_topk`` (here every token is
distilled: the worst case). The batch goes in shards of ``--shard-rows`` rows, ``--wave`` shards in flight, so the
object store never holds the whole batch.

Paths timed over the whole batch (a fresh teacher payload per shard; the time runs from the teacher's ``put``
to the student holding its own copy):

* ``object_store``: the pipeline's path. A teacher actor ``put``s each packed shard in its object store and
  returns a handle (:class:`TopKShard`); the driver forwards the handles (:class:`TeacherLogits`) to a student
  actor, which fetches the rows (``TeacherLogits.fetch``) and copies them into its own arrays.
* ``via_driver``: the path avoided. The teacher returns the arrays, the driver gets them and passes them to the
  student as arguments (a round trip through the driver).
* ``memcpy``: ``np.copyto`` of the same packed bytes in one process (memory bandwidth), the baseline.

``ratio_vs_memcpy`` is a path's throughput divided by memcpy's. The last stdout line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import Any, cast

import numpy as np

from tools.bench._measure import environment, measure
from tools.bench._report import add_report_arguments, emit_result, fmt_rate, fmt_seconds, table

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def make_payload(rows: int, seq: int, k: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """One shard's packed arrays, built with the pipeline's own pack_topk (every position distilled)."""
    import torch

    from roll.pipelines.distill.transfer import pack_topk

    gen = torch.Generator().manual_seed(seed)
    log_probs = torch.log_softmax(torch.randn(rows, seq, k, generator=gen), -1)
    indices = torch.randint(0, vocab, (rows, seq, k), generator=gen, dtype=torch.int32)
    return pack_topk(log_probs, indices, torch.ones(rows, seq, dtype=torch.bool), vocab)


def _copy_out(packed: dict[str, np.ndarray]) -> int:
    owned = {key: np.array(value, copy=True) for key, value in packed.items()}
    return sum(a.nbytes for a in owned.values())


def build_actors(payload: dict[str, np.ndarray], rows: int) -> tuple[Any, Any]:
    import ray

    from roll.pipelines.distill.transfer import TeacherLogits, put_topk

    @ray.remote(num_cpus=0)
    class Teacher:
        def __init__(self, template: dict[str, np.ndarray], rows: int) -> None:
            self.template, self.rows = template, rows

        def shard(self) -> Any:  # the pipeline's compute_topk ends in this put (a new object each call)
            return put_topk(self.template, rows=self.rows)

        def arrays(self) -> dict[str, np.ndarray]:  # serialized into the object store as the call's result
            return self.template

    @ray.remote(num_cpus=0)
    class Student:
        def consume(self, teacher: TeacherLogits) -> int:  # shard by shard, as a student rank fetches its rows
            starts = np.cumsum([0] + [s.rows for s in teacher.shards])
            return sum(_copy_out(teacher.fetch(int(a), int(b))) for a, b in itertools.pairwise(starts))

        def consume_arrays(self, *shards: dict[str, np.ndarray]) -> int:
            return sum(_copy_out(shard) for shard in shards)

    return cast(Any, Teacher).remote(payload, rows), cast(Any, Student).remote()  # ray.remote classes


def run_paths(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from roll.pipelines.distill.transfer import TeacherLogits

    payload = make_payload(args.shard_rows, args.seq, args.k, args.vocab, args.seed)
    shard_bytes = sum(a.nbytes for a in payload.values())
    shards = -(-args.rows // args.shard_rows)
    total = shard_bytes * shards
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        teacher, student = build_actors(payload, args.shard_rows)
        ray.get(teacher.shard.remote())  # actors up

        def object_store() -> int:
            moved = 0
            for start in range(0, shards, args.wave):
                handles = ray.get([teacher.shard.remote() for _ in range(min(args.wave, shards - start))])
                moved += ray.get(student.consume.remote(TeacherLogits(tuple(handles), args.k)))
            return moved

        def via_driver() -> int:
            moved = 0
            for start in range(0, shards, args.wave):
                arrays = ray.get([teacher.arrays.remote() for _ in range(min(args.wave, shards - start))])
                moved += ray.get(student.consume_arrays.remote(*arrays))
                del arrays
            return moved

        target = {key: np.empty_like(value) for key, value in payload.items()}

        def memcpy() -> int:
            for _ in range(shards):
                for key, value in payload.items():
                    np.copyto(target[key], value)
            return total

        timings = {
            name: measure(fn, reps=args.reps, warmup=1)
            for name, fn in (("memcpy", memcpy), ("object_store", object_store), ("via_driver", via_driver))
        }
        if object_store() != total or via_driver() != total:
            raise RuntimeError("a transfer path moved a different number of bytes than the batch holds")
    finally:
        ray.shutdown()
    rates = {name: total / t["median_s"] for name, t in timings.items()}
    return {"total_bytes": total, "shard_bytes": shard_bytes, "shards": shards, "timings": timings, "rates": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-rows", type=int, default=128, help="rows per shard (one teacher put)")
    parser.add_argument("--wave", type=int, default=2, help="shards in flight at once")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="64 rows x 256 tokens, 2 reps")
    add_report_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.seq, args.shard_rows, args.reps = 64, 256, 16, 2
    started = time.perf_counter()
    out = run_paths(args)
    memcpy_rate = out["rates"]["memcpy"]
    rows = [
        [name, fmt_seconds(out["timings"][name]["median_s"]), fmt_rate(rate), f"{rate / memcpy_rate:.3f}"]
        for name, rate in out["rates"].items()
    ]
    print(f"teacher top-k transfer: {args.rows} x {args.seq} tokens, k={args.k}, {out['total_bytes'] / 2**30:.2f} GiB")
    print(table(rows, ["path", "median", "throughput", "vs memcpy"]))
    emit_result(
        {
            "benchmark": "distill_logits",
            "rows": args.rows,
            "seq": args.seq,
            "k": args.k,
            "total_bytes": out["total_bytes"],
            "shard_bytes": out["shard_bytes"],
            "throughput_bytes_per_s": out["rates"],
            "ratio_vs_memcpy": {name: rate / memcpy_rate for name, rate in out["rates"].items()},
            "median_s": {name: t["median_s"] for name, t in out["timings"].items()},
            "wall_s": time.perf_counter() - started,
            "environment": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
