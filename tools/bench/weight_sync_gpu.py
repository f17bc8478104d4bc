"""Weight sync on one GPU: an ``fsdp2_train`` rank and an ``hf_infer`` engine on the same device (colocated), the
buckets shared through CUDA IPC, timed against a device-to-device copy of the same bytes in the same run.

    python -m tools.bench.weight_sync_gpu                      # ~0.7B-parameter model, 64 and 256 MB buckets
    python -m tools.bench.weight_sync_gpu --size big --reps 3  # the CPU benchmark's ~100M model

Needs a CUDA device (exits with a message without one). The trainer writes each bucket once into slots on its GPU;
the engine opens the slots once (CUDA IPC handles) and copies each bucket into its own weights, so one sync moves
the payload twice on the device (slot write, engine load). Baseline: ``copy_`` of a buffer of the payload's size
into another on the same GPU (torch, synchronized), measured in this process before each timed sync. Reported as
medians of ``--reps`` (the CPU bench's row: ``memcpy_*`` fields hold the device copy): the whole sync (driver wall
clock of ``update()``), the phases from the ``weight_sync/*`` metrics and per bucket, GB/s, and the sync as a
fraction of the copy's rate. Several engines on one GPU would need one role with two workers on a device, which
device_mapping does not allow; with two GPUs the second engine gets NCCL broadcasts
(``packages/roll-strategies/tests/test_weight_sync_gpu.py``). The last stdout line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench._report import add_report_arguments, emit_result, fmt_bytes, fmt_seconds, table
from tools.bench.strategies import BIG_OVERRIDES, log, start_role, summarize_channel

SIZES = {
    "big": BIG_OVERRIDES,  # ~105M parameters: the CPU benchmark's weight-sync model
    # ~0.7B parameters, head dim 64 (~2.9 GB of float32 weights).
    "xl": {"hidden_size": 2048, "num_layers": 16, "num_heads": 32, "num_kv_heads": 8, "intermediate_size": 5632},
}


def device_copier(nbytes: int):
    """A function timing one synchronized device-to-device copy of ``nbytes`` (buffers allocated once)."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warms up

    def copy() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    return copy


def time_sync(trainer, engine, bucket_mb: float, reps: int) -> dict[str, Any]:
    from roll.strategies import ModelUpdateGroup

    group = ModelUpdateGroup(trainer, engine, bucket_size_mb=bucket_mb, transport="auto")
    try:
        start = time.perf_counter()
        nbytes = int(group.update(0, force=True)["weight_sync/bytes"])  # untimed: opens the slots
        first_s = time.perf_counter() - start
        copy = device_copier(nbytes)
        runs, copies = [], []
        for _ in range(reps):
            copies.append(copy())
            start = time.perf_counter()
            metrics = group.update(0, force=True)
            metrics["driver_s"] = time.perf_counter() - start
            metrics["buckets_detail"] = group.last_buckets
            runs.append(metrics)
        del copy  # frees the copy's buffers
    finally:
        group.close()
    # The CPU bench's row, with the device copy as the "memcpy" baseline.
    return summarize_channel((1, 1, "auto"), group, runs, first_s, statistics.median(copies), bucket_mb)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_report_arguments(p)
    p.add_argument("--size", choices=sorted(SIZES), default="xl")
    p.add_argument("--bucket-mb", type=float, nargs="+", default=[64, 256])
    p.add_argument("--reps", type=int, default=5)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("weight_sync_gpu needs a CUDA device; the CPU transports are benchmarked by tools.bench.strategies")
    from roll.runtime import ResourceManager
    from roll.runtime.testing import local_ray
    from roll.strategies.testing import make_tiny_causal_lm

    rows = []
    with tempfile.TemporaryDirectory() as tmp, local_ray(num_cpus=64, log_to_driver=False):
        model = make_tiny_causal_lm(Path(tmp) / args.size, preset="small", overrides=SIZES[args.size])
        resources = ResourceManager()
        log(f"{args.size}: fsdp2_train on GPU 0 ({torch.cuda.get_device_name(0)})")
        trainer = start_role(resources, model, "fsdp2_train", {}, 1, devices=[0])
        try:
            log("  hf_infer on GPU 0")
            engine = start_role(resources, model, "hf_infer", {}, 1, devices=[0])
            try:
                for bucket_mb in args.bucket_mb:
                    rows.append({"model": args.size, **time_sync(trainer, engine, bucket_mb, args.reps)})
            finally:
                engine.shutdown()
        finally:
            trainer.shutdown()
    print(f"{args.size} model; routes: {rows[0]['routes']}")
    print(
        table(
            [
                [
                    f"{r['bucket_mb']:g} MB",
                    fmt_bytes(r["bytes"]),
                    r["buckets"],
                    fmt_seconds(r["seconds"]),
                    f"{r['gbps']:.1f}",
                    f"{r['memcpy_gbps']:.0f}",
                    f"{r['fraction_of_memcpy']:.1%}",
                    fmt_seconds(r["gather_s"]),
                    fmt_seconds(r["pack_s"]),
                    fmt_seconds(r["load_s"]),
                ]
                for r in rows
            ],
            ["bucket", "payload", "buckets", "sync", "GB/s", "copy GB/s", "of copy", "gather", "pack", "load"],
        )
    )
    emit_result(
        {"benchmark": "weight_sync_gpu", "device": torch.cuda.get_device_name(0), "rows": rows}, args.result_file
    )


if __name__ == "__main__":
    main()
