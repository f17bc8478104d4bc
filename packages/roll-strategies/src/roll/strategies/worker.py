"""StrategyWorker: the base Worker of model roles, with the lifecycle every strategy-backed role shares.

Role workers (actor, critic, reference, inference, judge...) subclass it and add their algorithm's registered
methods; loading, offloading, checkpoints and weight sync are defined once here and work for every backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import ray

from roll.protocol import Dispatch, register
from roll.runtime import Worker
from roll.strategies.base import InferenceStrategy, TrainStrategy
from roll.strategies.contract import OffloadTarget, StrategyError
from roll.strategies.registry import create_strategy, runs_across_nodes
from roll.strategies.weight_sync.cuda_ipc import device_uuid
from roll.strategies.weight_sync.object_store import export_buckets, load_buckets
from roll.strategies.weight_sync.plan import SyncPlan, build_plan
from roll.strategies.weight_sync.receiver import LoadTracker, ReceiverSession, TornWeightsGuard
from roll.strategies.weight_sync.routes import Endpoint, Routes
from roll.strategies.weight_sync.sender import ChannelSpec, SenderSession, open_channel
from roll.strategies.weight_sync.writer import WeightWriter

__all__ = ["StrategyWorker"]


class StrategyWorker(Worker):
    """A Worker that owns one strategy, built from ``worker_config.strategy_args`` in :meth:`initialize`."""

    strategy: InferenceStrategy

    def __init__(self, worker_config) -> None:
        super().__init__(worker_config)
        self._weight_writers: dict[str, WeightWriter] = {}
        self._weight_owned: dict[str, tuple[Any, Any]] = {}
        self._weight_senders: dict[str, SenderSession] = {}
        self._weight_receivers: dict[str, ReceiverSession] = {}
        self._object_store_writer: WeightWriter | None = None

    @classmethod
    def spans_nodes(cls, worker_config: Any) -> bool:
        """A worker may own devices on several nodes when its backend runs a multi-node engine (vllm, sglang: the
        ``multi_node_engine`` flag of the backend's config model)."""
        return runs_across_nodes(worker_config)

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

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_learning_rate(self, lr: float) -> None:
        """The base learning rate from the next optimizer step on (see :meth:`TrainStrategy.set_learning_rate`)."""
        self.train_strategy.set_learning_rate(lr)

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

    # --- weight sync: both ends (driven by ModelUpdateGroup; see roll.strategies.weight_sync) -------------
    def weight_writer(self) -> WeightWriter:
        """How this training worker's weights are read for a sync (the strategy's writer)."""
        return self.train_strategy.weight_writer()

    def _bare_strategy(self) -> InferenceStrategy:
        return self.strategy.wrapped if isinstance(self.strategy, TornWeightsGuard) else self.strategy

    def weight_endpoint(self) -> Endpoint:
        """Where this worker runs, for choosing each receiver's path (node, process, device)."""
        device = self._bare_strategy().device
        node = ray.get_runtime_context().get_node_id()
        return Endpoint(node=node, pid=os.getpid(), device=device.type, gpu=device_uuid(device))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def weight_sync_endpoint(self) -> Endpoint:
        return self.weight_endpoint()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def prepare_weight_sender(self, group: str, bucket_bytes: int) -> tuple[SyncPlan, bool]:
        """Build this rank's writer; returns the sync plan and whether the ranks can write their own shards."""
        writer = self.weight_writer()
        self._weight_writers[group] = writer
        return build_plan(writer.specs, bucket_bytes), writer.writes_shards

    def open_weight_channel(self, group: str, plan: SyncPlan, routes: Routes, timeout_s: float) -> ChannelSpec:
        """Rank 0 (called alone): create the ring and device slots; returns what the participants join."""
        spec, ring, cuda_slots = open_channel(
            group,
            plan,
            routes,
            device=self.strategy.device,
            gpu=device_uuid(self.strategy.device),
            address=self._roll_node_address(),
            timeout_s=timeout_s,
        )
        self._weight_owned[group] = (ring, cuda_slots)
        return spec

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def attach_weight_sender(self, spec: ChannelSpec) -> None:
        ring, cuda_slots = self._weight_owned.pop(spec.group, (None, None))
        writer = self._weight_writers.pop(spec.group)
        self._weight_senders[spec.group] = SenderSession(
            spec, self.rank, writer, device=self.strategy.device, ring=ring, cuda_slots=cuda_slots
        )

    def seal_weight_channel(self, group: str) -> None:
        """Rank 0, once every participant attached: drop the segment's name (no leak even if processes die)."""
        self._weight_senders[group].seal()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def weight_share_key(self) -> str | None:
        """The key under which this engine can share one copy of its weights on its node (None: it cannot)."""
        key = self._bare_strategy().weight_share_key()
        return None if key is None else f"{key[0]}:{key[1]}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def attach_weight_receiver(self, spec: ChannelSpec) -> None:
        strategy = self._bare_strategy()
        self._weight_receivers[spec.group] = ReceiverSession(spec, self.rank, device=strategy.device, strategy=strategy)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_weights(self, group: str) -> dict[str, Any]:
        return self._weight_senders[group].send()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self, group: str) -> dict[str, Any]:
        session = self._weight_receivers[group]
        return self._guarded_receive(lambda strategy: session.receive(strategy))

    def _guarded_receive(self, receive: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        """Run one sync. If it fails after a bucket reached the engine, the strategy is fenced off (its compute
        methods raise) until a later sync completes; if it fails before, the engine keeps its old weights."""
        strategy = self._bare_strategy()
        tracker = LoadTracker(strategy)
        try:
            metrics = receive(tracker)
        except BaseException as e:
            if tracker.touched:
                try:
                    strategy.abort_weight_update()
                finally:
                    # A stand-in that refuses every call until the next complete sync.
                    self.strategy = cast(
                        InferenceStrategy, TornWeightsGuard(strategy, f"{type(e).__name__}: {str(e)[:300]}")
                    )
            raise
        self.strategy = strategy
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weight_buckets(self, bucket_bytes: int) -> dict[str, Any]:
        """Object-store transport: rank 0's result holds the plan and one ObjectRef per packed bucket."""
        if self._object_store_writer is None:
            self._object_store_writer = self.weight_writer()
        writer = self._object_store_writer
        plan = build_plan(writer.specs, bucket_bytes)
        return {"plan": plan if self.rank == 0 else None, **export_buckets(writer, plan, self.rank)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weight_buckets(self, plan: SyncPlan, refs: list[Any]) -> dict[str, Any]:
        return self._guarded_receive(lambda strategy: load_buckets(strategy, plan, refs))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process_weights_after_loading(self) -> None:
        self._bare_strategy().process_weights_after_loading()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def close_weight_channel(self, group: str) -> None:
        self._weight_writers.pop(group, None)
        ring, _ = self._weight_owned.pop(group, (None, None))
        if ring is not None:
            ring.close()
        for sessions in (self._weight_senders, self._weight_receivers):
            session = sessions.pop(group, None)
            if session is not None:
                session.close()
