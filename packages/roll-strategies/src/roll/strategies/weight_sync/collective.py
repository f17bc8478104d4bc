"""Broadcast of ring buckets to receivers that cannot map the ring (another node, another GPU).

A standalone process group (gloo on CPU, NCCL on GPU; not the default group) joins training rank 0 (group rank 0)
and the far receivers. Rank 0 runs a :class:`Relay` thread that reads each bucket from the ring once the writers
have filled it and broadcasts it; each receiver runs a :class:`BroadcastReceiver` thread that receives bucket
``k + 1`` into one of two local buffers while the engine loads bucket ``k``. Every bucket is preceded by a small
header (global bucket number, bytes, status) so a sender that fails midway tells the receivers at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from roll.strategies.weight_sync.plan import SyncPlan
from roll.strategies.weight_sync.ring import SharedRing, WeightSyncAborted

__all__ = ["BroadcastGroup", "BroadcastReceiver", "Relay"]

logger = logging.getLogger(__name__)

_OK, _ABORT = 0, 1


class BroadcastGroup:
    """A process group of its own between a sender (rank 0) and receivers; joining blocks until all joined."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        world_size: int,
        rank: int,
        *,
        device: torch.device,
        timeout_s: float,
    ) -> None:
        self.rank = rank
        self.device = device
        timeout = timedelta(seconds=timeout_s)
        # Typed loosely: NCCL and Gloo groups share broadcast() at run time but not in torch's stubs.
        self._group: Any
        self._store: Any
        self._store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
        if device.type == "cuda":
            self._group = dist.ProcessGroupNCCL(self._store, rank, world_size, dist.ProcessGroupNCCL.Options())
        else:
            self._group = dist.ProcessGroupGloo(self._store, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([tensor], options).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream(tensor.device).synchronize()

    def header(self, bucket: int = 0, nbytes: int = 0, status: int = _OK) -> torch.Tensor:
        return torch.tensor([bucket, nbytes, status], dtype=torch.int64, device=self.device)

    def close(self) -> None:
        self._group = None
        self._store = None


class _Worker:
    """A daemon thread running one sync's loop; :meth:`join` re-raises what it raised."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _start(self, target) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as e:  # handed to the thread that joins
                self.error = e

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise WeightSyncAborted(f"{self._name} did not finish within {timeout_s:.0f} s")
            self._thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


class Relay(_Worker):
    """On training rank 0: broadcast each bucket the writers finish, then release its slot (as a ring reader)."""

    def __init__(self, group: BroadcastGroup, ring: SharedRing, reader: int, slots: list[torch.Tensor]) -> None:
        super().__init__("roll-weight-relay")
        self.group, self.ring, self.reader, self.slots = group, ring, reader, slots
        self.broadcast_s = 0.0

    def start(self, plan: SyncPlan, first: int, timeout_s: float) -> None:
        self.broadcast_s = 0.0

        def loop() -> None:
            in_broadcast = False
            try:
                for bucket in plan.buckets:
                    count = first + bucket.index + 1
                    self.ring.wait_written(count, timeout_s)
                    began = time.perf_counter()
                    in_broadcast = True
                    self.group.broadcast(self.group.header(count - 1, bucket.nbytes))
                    self.group.broadcast(self.slots[(count - 1) % len(self.slots)][: bucket.nbytes])
                    in_broadcast = False
                    self.broadcast_s += time.perf_counter() - began
                    self.ring.publish_read(self.reader, count)
            except BaseException as e:
                self.ring.abort(f"relay broadcast failed: {e}")
                if not in_broadcast:  # between buckets the group is usable: tell the receivers to stop
                    self._tell_receivers()
                raise

        self._start(loop)

    def _tell_receivers(self) -> None:
        try:
            self.group.broadcast(self.group.header(status=_ABORT))
        except Exception as e:  # the receivers may be the ones that failed
            logger.debug("could not send the abort header: %s", e)


class BroadcastReceiver(_Worker):
    """On a far receiver: two local buffers, filled by broadcast while the engine loads the other one."""

    def __init__(self, group: BroadcastGroup, slot_bytes: int) -> None:
        super().__init__("roll-weight-receiver")
        self.group = group
        self.slots = [torch.empty(slot_bytes, dtype=torch.uint8, device=group.device) for _ in range(2)]
        self._free: queue.Queue[int] = queue.Queue()
        self._ready: queue.Queue[int | BaseException] = queue.Queue()
        self._draining = False

    def start(self, plan: SyncPlan, first: int) -> None:
        self._free = queue.Queue()
        self._ready = queue.Queue()
        self._draining = False
        for slot in range(len(self.slots)):
            self._free.put(slot)
        header = self.group.header()

        def loop() -> None:
            try:
                for bucket in plan.buckets:
                    slot = self._free.get()
                    self.group.broadcast(header)
                    number, nbytes, status = (int(v) for v in header.tolist())
                    if status != _OK:
                        raise WeightSyncAborted("weight sync aborted: the sender failed midway (see its error)")
                    if number != first + bucket.index or nbytes != bucket.nbytes:
                        raise WeightSyncAborted(
                            f"weight sync out of step: got bucket {number} ({nbytes} bytes), expected "
                            f"{first + bucket.index} ({bucket.nbytes} bytes)"
                        )
                    self.group.broadcast(self.slots[slot][:nbytes])
                    # Draining (the engine failed): keep receiving so the sender and the other receivers finish.
                    (self._free if self._draining else self._ready).put(slot)
            except BaseException as e:
                self._ready.put(e)
                raise

        self._start(loop)

    def next(self, timeout_s: float) -> int:
        """The slot holding the next bucket (blocks)."""
        try:
            item = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            raise WeightSyncAborted(f"no bucket arrived by broadcast within {timeout_s:.0f} s") from None
        if isinstance(item, BaseException):
            raise item
        return item

    def release(self, slot: int) -> None:
        self._free.put(slot)

    def drain(self, timeout_s: float) -> None:
        """After a failed load: receive (and drop) the rest of this sync, so nobody else waits on this worker."""
        self._draining = True
        for slot in range(len(self.slots)):
            self._free.put(slot)
        try:
            self.join(timeout_s)
        except BaseException as e:
            logger.debug("draining the weight broadcast stopped: %s", e)
