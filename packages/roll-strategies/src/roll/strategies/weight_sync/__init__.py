"""Weight sync from a training role to inference roles, bucket by bucket, at memory speed where possible.

* :mod:`.plan`: the layout of every bucket, computed once per channel (no per-bucket headers, no per-tensor work).
* :mod:`.writer`: how training ranks produce full tensors (each rank its own shards, or gathered by rank 0).
* :mod:`.ring`: two bucket slots in ``/dev/shm`` and the counters that pass them between writers and readers
  (waiters sleep on a futex, :mod:`._futex`, and are woken when a counter moves).
* :mod:`.cuda_ipc`: the same slots in GPU memory, shared with colocated engines through CUDA IPC.
* :mod:`.collective`: gloo/NCCL broadcast to receivers that cannot map the slots (other nodes or GPUs).
* :mod:`.routes`: which receiver takes which path, from where the processes run.
* :mod:`.sender` / :mod:`.receiver`: the two ends of a channel; :mod:`.object_store`: the Ray fallback.

The driver side is :class:`roll.strategies.ModelUpdateGroup`.
"""

from __future__ import annotations

from roll.strategies.weight_sync.plan import BucketPlan, SyncPlan, TensorSpec, build_plan
from roll.strategies.weight_sync.ring import WeightSyncAborted
from roll.strategies.weight_sync.routes import TRANSPORTS, Endpoint, Routes, plan_routes
from roll.strategies.weight_sync.writer import GatheredWriter, WeightWriter, WriteStats, weight_sync_env

__all__ = [
    "TRANSPORTS",
    "BucketPlan",
    "Endpoint",
    "GatheredWriter",
    "Routes",
    "SyncPlan",
    "TensorSpec",
    "WeightSyncAborted",
    "WeightWriter",
    "WriteStats",
    "build_plan",
    "plan_routes",
    "weight_sync_env",
]
