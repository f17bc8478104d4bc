"""StrategyWorker: the base Worker of model roles, with the lifecycle every strategy-backed role shares.

Role workers (actor, critic, reference, inference, judge...) subclass it and add their algorithm's registered
methods; loading, offloading, checkpoints and weight sync are defined once here and work for every backend.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from roll.protocol import Dispatch, register
from roll.runtime import Worker
from roll.strategies.base import InferenceStrategy, TrainStrategy
from roll.strategies.contract import OffloadTarget, StrategyError
from roll.strategies.registry import create_strategy
from roll.strategies.weights import WeightChannel, iter_buckets, pack_bucket, unpack_bucket

__all__ = ["StrategyWorker"]


class StrategyWorker(Worker):
    """A Worker that owns one strategy, built from ``worker_config.strategy_args`` in :meth:`initialize`."""

    strategy: InferenceStrategy

    def __init__(self, worker_config) -> None:
        super().__init__(worker_config)
        self._channels: dict[str, WeightChannel] = {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        super().initialize(settings)
        self.strategy = create_strategy(self)
        self.strategy.initialize()

    @property
    def train_strategy(self) -> TrainStrategy:
        if not isinstance(self.strategy, TrainStrategy):
            raise StrategyError(f"{self.worker_name} runs {self.strategy.strategy_name}, which does not train")
        return self.strategy

    # --- device memory ----------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def offload_states(self, include: list[str] | None = None) -> None:
        self.strategy.offload_states(None if include is None else [OffloadTarget(i) for i in include])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_states(self, include: list[str] | None = None) -> None:
        self.strategy.load_states(None if include is None else [OffloadTarget(i) for i in include])

    # --- checkpoints ------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.train_strategy.save_checkpoint(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.train_strategy.load_checkpoint(path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self.train_strategy.export_hf(path)

    # --- weight sync: sender (training role) ------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def setup_weight_sender(self, group: str, master_addr: str, master_port: int, world_size: int) -> None:
        if self.rank == 0:
            self._channels[group] = WeightChannel(master_addr, master_port, world_size, 0, device=self.strategy.device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self, group: str, bucket_bytes: int) -> dict[str, float]:
        start = time.perf_counter()
        buckets = iter_buckets(self.train_strategy.named_weights(), bucket_bytes)
        if self.rank == 0:
            sent = self._channels[group].send(buckets)
        else:
            sent = 0
            for _ in buckets:  # other ranks take part in the gathers that materialize each full tensor
                pass
        return {"weight_sync/bytes": float(sent), "weight_sync/send_s": time.perf_counter() - start}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weight_buckets(self, bucket_bytes: int) -> list[Any]:
        """Object-store transport: rank 0 returns one ObjectRef per packed bucket (others return [])."""
        refs = []
        for items in iter_buckets(self.train_strategy.named_weights(), bucket_bytes):
            if self.rank == 0:
                entries, flat = pack_bucket([(n, t.cpu()) for n, t in items])
                refs.append(ray.put((entries, flat)))
        return refs

    # --- weight sync: receiver (inference role) ---------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def setup_weight_receiver(
        self, group: str, master_addr: str, master_port: int, world_size: int, rank_offset: int
    ) -> None:
        rank = rank_offset + self.rank
        self._channels[group] = WeightChannel(master_addr, master_port, world_size, rank, device=self.strategy.device)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self, group: str) -> dict[str, float]:
        start = time.perf_counter()
        received = 0
        for items in self._channels[group].receive():
            received += sum(t.numel() * t.element_size() for _, t in items)
            self.strategy.update_weights(items)
        return {"weight_sync/received_bytes": float(received), "weight_sync/receive_s": time.perf_counter() - start}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weight_buckets(self, refs: list[Any]) -> dict[str, float]:
        start = time.perf_counter()
        received = 0
        for ref in refs:
            entries, flat = ray.get(ref)
            received += flat.numel()
            self.strategy.update_weights(unpack_bucket(entries, flat.to(self.strategy.device)))
        return {"weight_sync/received_bytes": float(received), "weight_sync/receive_s": time.perf_counter() - start}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process_weights_after_loading(self) -> None:
        self.strategy.process_weights_after_loading()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def close_weight_channel(self, group: str) -> None:
        channel = self._channels.pop(group, None)
        if channel is not None:
            channel.close()
