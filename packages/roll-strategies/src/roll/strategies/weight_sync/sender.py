"""The training side of a weight-sync channel: fill the ring bucket by bucket, relay to far receivers.

Every training rank holds a :class:`SenderSession`. Writers (see :class:`~.routes.Routes`) wait until the slot of
bucket ``g`` is free, write their part of it, and publish it; the other ranks only take part in the writer's
collectives (gathers). Rank 0 also owns the ring (and the slots on its GPU for CUDA IPC) and, with far
receivers, a relay thread that broadcasts each finished bucket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch

from roll.strategies.weight_sync.collective import BroadcastGroup, Relay
from roll.strategies.weight_sync.cuda_ipc import export_slots
from roll.strategies.weight_sync.plan import SyncPlan, slot_views
from roll.strategies.weight_sync.ring import NUM_SLOTS, SharedRing
from roll.strategies.weight_sync.routes import Routes
from roll.strategies.weight_sync.writer import WeightWriter, WriteStats

__all__ = ["ChannelSpec", "SenderSession", "host_slots", "open_channel"]


@dataclass(frozen=True)
class ChannelSpec:
    """Everything a participant needs to join a channel (sent once, at setup)."""

    group: str
    plan: SyncPlan
    routes: Routes
    ring: str  # the segment's name in /dev/shm
    gpu: str | None  # the owner's GPU (UUID) for device slots
    cuda_handles: list[Any] | None  # IPC handles of the device slots, when colocated receivers read them
    master: tuple[str, int] | None  # rendezvous of the broadcast group, when there are far receivers
    timeout_s: float

    @property
    def broadcast_world(self) -> int:
        return 1 + len(self.routes.broadcast)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


# A host ring gets up to this many slots, within HOST_RING_BYTES (and never fewer than NUM_SLOTS).
MAX_HOST_SLOTS = 4
HOST_RING_BYTES = 1 << 30


def host_slots(plan: SyncPlan) -> int:
    """Slots of a ``/dev/shm`` ring: with more than two, writers run up to ``slots - 1`` buckets ahead of the
    slowest reader, so a reader that is late to wake up (on a busy machine a woken process can wait tens of
    milliseconds for a core) does not stall the writers bucket after bucket."""
    fit = HOST_RING_BYTES // max(plan.slot_bytes, 1)
    return max(NUM_SLOTS, min(MAX_HOST_SLOTS, len(plan.buckets), fit))


def open_channel(
    group: str,
    plan: SyncPlan,
    routes: Routes,
    *,
    device: torch.device,
    gpu: str | None,
    address: str,
    timeout_s: float,
) -> tuple[ChannelSpec, SharedRing, list[torch.Tensor] | None]:
    """On training rank 0: create the ring (and device slots), pick the broadcast rendezvous."""
    host = routes.storage == "host"
    ring = SharedRing.create(
        num_writers=len(routes.writers),
        num_readers=routes.ring_readers,
        slot_bytes=plan.slot_bytes,
        host_slots=host,
        num_slots=host_slots(plan) if host else NUM_SLOTS,
    )
    cuda_slots = None
    handles = None
    if not host:
        cuda_slots = [torch.empty(plan.slot_bytes, dtype=torch.uint8, device=device) for _ in range(ring.num_slots)]
        handles = export_slots(cuda_slots) if routes.readers else None
    master = (address, _free_port()) if routes.broadcast else None
    spec = ChannelSpec(group, plan, routes, ring.name, gpu, handles, master, timeout_s)
    return spec, ring, cuda_slots


class SenderSession:
    def __init__(
        self,
        spec: ChannelSpec,
        rank: int,
        writer: WeightWriter,
        *,
        device: torch.device,
        ring: SharedRing | None = None,
        cuda_slots: list[torch.Tensor] | None = None,
    ) -> None:
        self.spec, self.rank, self.writer, self.device = spec, rank, writer, device
        routes = spec.routes
        self.writer_index = routes.writers.index(rank) if rank in routes.writers else None
        self.ring = ring
        if self.ring is None and self.writer_index is not None:
            self.ring = SharedRing.attach(spec.ring)
        self.slots = cuda_slots if cuda_slots is not None else (self.ring.slots if self.ring is not None else [])
        # One list of views per (slot, bucket), made once: the hot loop only indexes them.
        self.outs = [[[t for _, t in bucket] for bucket in slot_views(spec.plan, s)] for s in self.slots]
        if self.ring is not None and self.writer_index is not None:
            self.ring.join(writer=self.writer_index)
        self.group: BroadcastGroup | None = None
        self.relay: Relay | None = None
        if rank == 0 and routes.relay:
            if self.ring is None or spec.master is None:
                raise RuntimeError("weight sync: rank 0 relays to far receivers but holds no ring or rendezvous")
            self.ring.join(reader=len(routes.readers))
            address, port = spec.master
            self.group = BroadcastGroup(address, port, spec.broadcast_world, 0, device=device, timeout_s=spec.timeout_s)
            self.relay = Relay(self.group, self.ring, len(routes.readers), self.slots)
        self.syncs = 0

    def seal(self) -> None:
        """Remove the segment's name once every participant mapped it."""
        if self.ring is not None:
            self.ring.unlink()

    def send(self) -> dict[str, Any]:
        plan, ring, timeout = self.spec.plan, self.ring, self.spec.timeout_s
        first = self.syncs * len(plan.buckets)
        self.syncs += 1
        started_at, began = time.time(), time.perf_counter()
        stats, wait_s, write_cpu_s, buckets = WriteStats(), 0.0, 0.0, []
        if self.relay is not None:
            self.relay.start(plan, first, timeout)
        try:
            for bucket in plan.buckets:
                count = first + bucket.index
                out = None
                waited = 0.0
                if self.writer_index is not None:
                    assert ring is not None  # writers always hold the ring
                    waited = ring.wait_read(count - ring.num_slots + 1, timeout)
                    out = self.outs[count % ring.num_slots][bucket.index]
                cpu, wall = time.process_time(), time.perf_counter()
                part = self.writer.write(bucket.start, bucket.stop, out, local=self.spec.routes.local_writes)
                write_cpu_s += time.process_time() - cpu
                write_s = time.perf_counter() - wall
                if self.writer_index is not None:
                    if self.device.type == "cuda":
                        torch.cuda.current_stream(self.device).synchronize()
                    assert ring is not None
                    ring.publish_written(self.writer_index, count + 1)
                stats.add(part)
                wait_s += waited
                buckets.append({"wait_s": waited, "gather_s": part.gather_s, "pack_s": part.pack_s, "write_s": write_s})
            if self.relay is not None:
                self.relay.join(timeout)
        except BaseException as e:
            self.writer.finish()
            if ring is not None:
                ring.abort(f"training rank {self.rank} (pid {os.getpid()}) failed: {e!r}")
            if self.relay is not None:
                with contextlib.suppress(BaseException):  # its own error is a consequence of this one
                    self.relay.join(min(timeout, 30.0))
            raise
        metrics: dict[str, Any] = {
            "weight_sync/gather_s": stats.gather_s,
            "weight_sync/pack_s": stats.pack_s,
            # CPU seconds of this process while gathering + packing: on a busy machine, wall time minus this is
            # time spent waiting for a core.
            "weight_sync/write_cpu_s": write_cpu_s,
            "weight_sync/send_wait_s": wait_s,
            "weight_sync/send_s": time.perf_counter() - began,
            "weight_sync/send_started_at": started_at,
            "weight_sync/buckets": float(len(plan.buckets)),
            "weight_sync/_buckets": buckets,
        }
        if self.rank == 0:
            metrics["weight_sync/bytes"] = float(plan.payload)
        if self.relay is not None:
            metrics["weight_sync/broadcast_s"] = self.relay.broadcast_s
        return metrics

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        self.outs = []
        self.slots = []
        if self.ring is not None:
            self.ring.close()
            self.ring = None
