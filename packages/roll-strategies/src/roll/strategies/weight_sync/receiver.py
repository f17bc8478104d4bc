"""The inference side of a weight-sync channel: load each bucket in place, then finish the engine's reload.

A near receiver maps the ring (``/dev/shm`` or the owner's GPU slots) and hands the engine views of the slot; a
far receiver gets each bucket by broadcast into one of two local buffers while it loads the other. Either way
the engine sees ``(name, tensor)`` lists built once per channel, valid only during its ``update_weights`` call.

A receiver whose engine fails midway keeps consuming the rest of the sync without loading it (so the sender and
the other receivers finish), then fails; :class:`TornWeightsGuard` then stops the worker from computing with a
half-updated model until a later sync completes.

A receiver whose engine shares its weights with another receiver's (:mod:`.shared_weights`, ``routes.shares``)
reads nothing: it waits for that leader to finish each sync, then finishes its own engine's reload; it is fenced
like the leader when the leader's sync fails midway.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from roll.strategies.base import InferenceStrategy, StrategyError
from roll.strategies.weight_sync.collective import BroadcastGroup, BroadcastReceiver
from roll.strategies.weight_sync.cuda_ipc import import_slots
from roll.strategies.weight_sync.plan import slot_views
from roll.strategies.weight_sync.ring import SharedRing, WeightSyncAborted
from roll.strategies.weight_sync.sender import ChannelSpec
from roll.strategies.weight_sync.shared_weights import SHARE_HEADER_BYTES, SharedWeights, SharedWeightsTorn, share_name

__all__ = ["LoadTracker", "ReceiverSession", "TornWeightsGuard"]

logger = logging.getLogger(__name__)


class ReceiverSession:
    def __init__(
        self, spec: ChannelSpec, rank: int, *, device: torch.device, strategy: InferenceStrategy | None = None
    ) -> None:
        """Join the channel as receiver ``rank``; ``strategy`` (the engine) is needed when it shares weights."""
        self.spec, self.rank, self.device = spec, rank, device
        routes = spec.routes
        self.ring: SharedRing | None = None
        self.group: BroadcastGroup | None = None
        self.receiver: BroadcastReceiver | None = None
        self.shared: SharedWeights | None = None
        self.syncs = 0
        leader = routes.leader_of(rank)
        if leader is not None:
            self._slots, self.views = [], []
            self.shared = self._follow(spec, leader, strategy)
            return
        if rank in routes.readers:
            self.reader_index = routes.readers.index(rank)
            ring = self.ring = SharedRing.attach(spec.ring)
            ring.join(reader=self.reader_index)
            if routes.storage == "host":
                slots = ring.slots
            elif spec.cuda_handles is None or spec.gpu is None:
                raise RuntimeError("weight sync: device slots were routed to this reader without their IPC handles")
            else:
                slots = import_slots(spec.cuda_handles, spec.gpu)
        else:
            if spec.master is None:
                raise RuntimeError(f"weight sync: rank {rank} is a far receiver but the channel has no rendezvous")
            address, port = spec.master
            member = 1 + routes.broadcast.index(rank)
            self.group = BroadcastGroup(
                address, port, spec.broadcast_world, member, device=device, timeout_s=spec.timeout_s
            )
            receiver = self.receiver = BroadcastReceiver(self.group, spec.plan.slot_bytes)
            slots = receiver.slots
        self._slots = slots
        self.views = [slot_views(spec.plan, slot) for slot in slots]
        followers = routes.followers_of(rank)
        if followers:
            self.shared = self._lead(spec, len(followers), strategy)

    def _lead(self, spec: ChannelSpec, followers: int, strategy: InferenceStrategy | None) -> SharedWeights:
        """Put this engine's weights into a new shared segment and wait for its ``followers`` to re-bind to it."""
        shared = SharedWeights.create(share_name(spec.ring, self.rank), followers)
        try:
            key = strategy.weight_share_key() if strategy is not None else None
            if strategy is None or key is None:
                raise StrategyError(f"receiver {self.rank} was made to lead shared weights but its engine cannot")
            shared.reserve(key[1])
            strategy.share_weights(str(shared.path), SHARE_HEADER_BYTES, fill=True)
            shared.mark_ready()
            shared.wait_attached(followers, self.spec.timeout_s)
        except BaseException:
            shared.mark_ready(ok=False)
            shared.close(unlink=False)
            raise
        return shared

    def _follow(self, spec: ChannelSpec, leader: int, strategy: InferenceStrategy | None) -> SharedWeights:
        """Map the segment receiver ``leader`` filled and re-bind this engine's weights to it."""
        name, follower = share_name(spec.ring, leader), spec.routes.followers_of(leader).index(self.rank)
        try:
            shared = SharedWeights.attach(name, spec.timeout_s)
        except BaseException:
            SharedWeights.refuse(name, follower)
            raise
        try:
            if strategy is None:
                raise StrategyError(f"receiver {self.rank} shares weights but was given no engine")
            strategy.share_weights(str(shared.path), SHARE_HEADER_BYTES, fill=False)
            shared.mark_attached(follower)
        except BaseException:
            shared.mark_attached(follower, ok=False)
            shared.close()
            raise
        return shared

    def _next(self, count: int) -> tuple[int, float]:
        """The slot holding bucket ``count`` (global number) and the seconds waited for it."""
        if self.ring is not None:
            return count % self.ring.num_slots, self.ring.wait_written(count + 1, self.spec.timeout_s)
        began = time.perf_counter()
        assert self.receiver is not None  # a reader without a ring is a broadcast member
        slot = self.receiver.next(self.spec.timeout_s)
        return slot, time.perf_counter() - began

    def _release(self, slot: int, count: int) -> None:
        if self.ring is not None:
            self.ring.publish_read(self.reader_index, count + 1)
        else:
            assert self.receiver is not None
            self.receiver.release(slot)

    def receive(self, strategy: InferenceStrategy) -> dict[str, Any]:
        if self.shared is not None and not self.shared.created:
            return self._receive_shared(strategy)
        sync = self.syncs
        try:
            metrics = self._receive(strategy)
        except BaseException:
            if self.shared is not None:
                self.shared.mark_failed(sync, torn=getattr(strategy, "touched", True))
            raise
        if self.shared is not None:
            self.shared.mark_done(sync)
        return metrics

    def _receive_shared(self, strategy: InferenceStrategy) -> dict[str, Any]:
        """A follower's sync: wait for the leader to load it, then finish this engine's reload."""
        assert self.shared is not None
        sync, began, started_at = self.syncs, time.perf_counter(), time.time()
        self.syncs += 1
        try:
            waited = self.shared.wait_done(sync, self.spec.timeout_s)
        except SharedWeightsTorn:
            if isinstance(strategy, LoadTracker):
                strategy.touched = True  # the weights this engine computes with are half-updated
            raise
        finalized = time.perf_counter()
        strategy.process_weights_after_loading()
        return {
            "weight_sync/received_bytes": float(self.spec.plan.payload),  # in its engine, by the leader's load
            "weight_sync/receive_wait_s": waited,
            "weight_sync/finalize_s": time.perf_counter() - finalized,
            "weight_sync/receive_s": time.perf_counter() - began,
            "weight_sync/last_byte_at": started_at,  # it reads no byte itself
            "weight_sync/_buckets": [],
        }

    def _receive(self, strategy: InferenceStrategy) -> dict[str, Any]:
        plan = self.spec.plan
        first = self.syncs * len(plan.buckets)
        self.syncs += 1
        began = time.perf_counter()
        wait_s = load_s = load_cpu_s = 0.0
        last_byte_at = time.time()
        buckets = []
        if self.receiver is not None:
            self.receiver.start(plan, first)
        done = 0
        try:
            for bucket in plan.buckets:
                count = first + bucket.index
                slot, waited = self._next(count)
                last_byte_at = time.time()
                loaded, cpu = time.perf_counter(), time.process_time()
                strategy.update_weights(self.views[slot][bucket.index])
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
                took = time.perf_counter() - loaded
                load_cpu_s += time.process_time() - cpu
                self._release(slot, count)
                done += 1
                wait_s += waited
                load_s += took
                buckets.append({"wait_s": waited, "load_s": took})
            if self.receiver is not None:
                self.receiver.join(self.spec.timeout_s)
            finalized = time.perf_counter()
            strategy.process_weights_after_loading()
            finalize_s = time.perf_counter() - finalized
        except BaseException:
            self._drain(first, done)
            raise
        return {
            "weight_sync/received_bytes": float(plan.payload),
            "weight_sync/receive_wait_s": wait_s,
            "weight_sync/load_s": load_s,
            "weight_sync/load_cpu_s": load_cpu_s,  # CPU seconds of this process while loading
            "weight_sync/finalize_s": finalize_s,
            "weight_sync/receive_s": time.perf_counter() - began,
            "weight_sync/last_byte_at": last_byte_at,
            "weight_sync/_buckets": buckets,
        }

    def _drain(self, first: int, done: int) -> None:
        """Consume the buckets after a failure without loading them, unless the whole sync was aborted."""
        if self.receiver is not None:
            self.receiver.drain(self.spec.timeout_s)
            return
        ring = self.ring
        if ring is None or ring.aborted:
            return
        try:
            # The failed bucket was not released yet: release it and every later one as it arrives.
            for bucket in self.spec.plan.buckets[done:]:
                count = first + bucket.index
                ring.wait_written(count + 1, self.spec.timeout_s)
                ring.publish_read(self.reader_index, count + 1)
        except WeightSyncAborted as e:
            logger.debug("draining the weight ring stopped: %s", e)

    def close(self) -> None:
        self.views = []
        self._slots = []
        if self.shared is not None:
            self.shared.close()
            self.shared = None
        if self.receiver is not None:
            self.receiver.slots = []
            self.receiver = None
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class LoadTracker:
    """What a receiver loop sees of the strategy: records whether any bucket reached the engine."""

    def __init__(self, strategy: InferenceStrategy) -> None:
        self.strategy = strategy
        self.device = strategy.device
        self.touched = False

    def update_weights(self, named_tensors: Any) -> None:
        self.touched = True
        self.strategy.update_weights(named_tensors)

    def process_weights_after_loading(self) -> None:
        self.strategy.process_weights_after_loading()


# Methods a worker may still call on a strategy whose weights are half-updated: weight sync, memory, shutdown.
_ALLOWED_WHEN_TORN = frozenset(
    {
        "update_weights",
        "process_weights_after_loading",
        "abort_weight_update",
        "offload_states",
        "load_states",
        "shutdown",
    }
)


class TornWeightsGuard:
    """Stands in for a strategy whose last weight sync failed midway: compute methods raise until a sync completes.

    Attribute reads (device, tokenizer, config...) and the methods in ``_ALLOWED_WHEN_TORN`` pass through.
    """

    def __init__(self, strategy: InferenceStrategy, reason: str) -> None:
        self._strategy = strategy
        self._reason = reason

    @property
    def wrapped(self) -> InferenceStrategy:
        return self._strategy

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._strategy, name)
        if callable(value) and not name.startswith("_") and name not in _ALLOWED_WHEN_TORN:
            reason = self._reason

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise StrategyError(
                    f"{type(self._strategy).__name__}.{name}: the last weight sync failed midway ({reason}); this "
                    "worker's weights are partly updated, so it refuses to compute until a weight sync completes"
                )

            return refuse
        return value
