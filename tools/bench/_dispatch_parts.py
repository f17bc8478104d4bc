"""The workers and raw-Ray calls that tools/bench/dispatch.py times, in a module of their own (imported when the
benchmark runs) so that importing the benchmark (``--help``) does not load Ray, torch and roll.runtime."""

from __future__ import annotations

import importlib
import os
from typing import Any

import ray
import torch

from roll.runtime import DataProto, Dispatch, Worker, WorkerConfig, register


# --- the workers ----------------------------------------------------------------------------------------------
class RollBenchWorker(Worker):
    """roll side: a no-op broadcast and a data-parallel identity."""

    def __init__(self, worker_config: WorkerConfig) -> None:
        super().__init__(worker_config)
        torch.set_num_threads(1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def identity(self, data: DataProto) -> DataProto:
        return data


class RawActor:
    """raw Ray side: the same two methods on a plain actor."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        importlib.import_module("roll.protocol")  # as a roll worker does at start, not at the first DataProto

    def ready(self) -> int:
        return os.getpid()

    def noop(self) -> None:
        return None

    def identity(self, data: DataProto) -> DataProto:
        return data


def raw_noop(actors: list[Any]) -> list[None]:
    return ray.get([a.noop.remote() for a in actors])


def raw_identity(actors: list[Any], batch: DataProto) -> DataProto:
    parts = batch.chunk(len(actors))
    return DataProto.concat(ray.get([a.identity.remote(p) for a, p in zip(actors, parts)]))


def make_batch(rows: int, nbytes: int) -> DataProto:
    """One float32 tensor of ``rows`` rows and ``nbytes`` bytes in all (0 bytes: a zero-width tensor)."""
    width = nbytes // (4 * rows)
    return DataProto.from_dict(tensors={"x": torch.ones((rows, width), dtype=torch.float32)})


def start_raw_actors(n: int) -> list[Any]:
    """``n`` plain actors with the logical CPUs a roll CPU worker asks for, started and ready."""
    cpus = WorkerConfig().num_cpus_per_worker
    actors: list[Any] = [ray.remote(RawActor).options(num_cpus=cpus, max_concurrency=1).remote() for _ in range(n)]
    ray.get([a.ready.remote() for a in actors])
    return actors
