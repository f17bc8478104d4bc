"""Weight sync through Ray's object store: the fallback when no shared memory or process group can be set up.

Training rank 0 packs each bucket of the plan into a fresh buffer and puts it in the object store; every
receiver fetches the buffers (zero-copy on the same node) and loads views of them.
"""

from __future__ import annotations

import time
from typing import Any

import ray
import torch

from roll.strategies.base import InferenceStrategy
from roll.strategies.weight_sync.plan import SyncPlan, bucket_views
from roll.strategies.weight_sync.writer import WeightWriter, WriteStats

__all__ = ["export_buckets", "load_buckets"]


def export_buckets(writer: WeightWriter, plan: SyncPlan, rank: int) -> dict[str, Any]:
    """Every training rank calls this (the writer gathers); rank 0's result holds one ObjectRef per bucket."""
    began, started_at = time.perf_counter(), time.time()
    stats, refs, put_s = WriteStats(), [], 0.0
    try:
        for bucket in plan.buckets:
            flat = torch.empty(bucket.nbytes, dtype=torch.uint8) if rank == 0 else None
            out = [t for _, t in bucket_views(plan, bucket, flat)] if flat is not None else None
            stats.add(writer.write(bucket.start, bucket.stop, out, local=False))
            if flat is not None:
                put = time.perf_counter()
                refs.append(ray.put(flat))
                put_s += time.perf_counter() - put
    except BaseException:
        writer.finish()
        raise
    return {
        "refs": refs,
        "metrics": {
            "weight_sync/gather_s": stats.gather_s,
            "weight_sync/pack_s": stats.pack_s + put_s,
            "weight_sync/send_s": time.perf_counter() - began,
            "weight_sync/send_started_at": started_at,
            "weight_sync/buckets": float(len(plan.buckets)),
            **({"weight_sync/bytes": float(plan.payload)} if rank == 0 else {}),
        },
    }


def load_buckets(strategy: InferenceStrategy, plan: SyncPlan, refs: list[Any]) -> dict[str, Any]:
    began = time.perf_counter()
    wait_s = load_s = 0.0
    last_byte_at = time.time()
    for bucket, ref in zip(plan.buckets, refs):
        fetched = time.perf_counter()
        flat = ray.get(ref)
        last_byte_at = time.time()
        loaded = time.perf_counter()
        wait_s += loaded - fetched
        strategy.update_weights(bucket_views(plan, bucket, flat.to(strategy.device)))
        load_s += time.perf_counter() - loaded
        del flat
    finalized = time.perf_counter()
    strategy.process_weights_after_loading()
    return {
        "weight_sync/received_bytes": float(plan.payload),
        "weight_sync/receive_wait_s": wait_s,
        "weight_sync/load_s": load_s,
        "weight_sync/finalize_s": time.perf_counter() - finalized,
        "weight_sync/receive_s": time.perf_counter() - began,
        "weight_sync/last_byte_at": last_byte_at,
    }
