"""A bucket ring in shared memory: ``n`` slots (two or more) and the counters that hand them from writers to readers.

One segment per channel lives in ``/dev/shm``: a control block (a few int64 counters, one cache line each), an
abort message, then ``n`` slots of ``slot_bytes`` (none when the slots are device memory shared by CUDA IPC).
Every process of one node maps the same pages, so a bucket written once is read in place by every reader.

Protocol (``g`` counts buckets over the channel's life, sync after sync): a writer puts bucket ``g`` in slot
``g % n`` once every reader has finished bucket ``g - n`` (all ``read`` counters >= g - n + 1), then sets its own
``written`` counter to ``g + 1``; a reader waits for every ``written`` counter >= g + 1, reads, and sets its
``read`` counter to ``g + 1``. Several writers (training ranks that each fill the shards they own) write
disjoint bytes of the same bucket. Counters are aligned 8-byte stores, seen in program order on x86 (TSO).
Waiting: a waiter sleeps on a futex over the low half of the counter it waits for, and every publish wakes that
word's sleepers (:mod:`._futex`), so a bucket reaches its readers with one wake-up and no polling; where futexes
are unavailable, waiters poll with sleeps of up to 1 ms.

Failure: any participant that fails sets the abort flag with a message (and wakes every waiter); every waiter
checks it and the liveness of its peers (same node, so by pid), so a dead or failing process stops the others
within ~100 ms instead of a timeout. Cleanup: the segment's name is removed as soon as every participant has
mapped it (``unlink``), so the memory goes away with the last process that maps it, even if processes are
killed. Names carry the creator's pid; a name left by a dead creator (killed between create and unlink) is
removed by the next :meth:`create`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll.strategies.base import StrategyError
from roll.strategies.weight_sync import _futex

__all__ = ["SHM_DIR", "SharedRing", "WeightSyncAborted", "sweep_stale_segments"]

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "roll-ws-"
NUM_SLOTS = 2  # the fewest slots a ring has (double buffering); host rings may have more, see create()
_MAGIC = 0x524F4C4C5753  # "ROLLWS"
_LINE = 8  # int64 words per cache line: every counter gets a line of its own
_MESSAGE_BYTES = 2048
_PAGE = mmap.PAGESIZE
_CHECK_PEERS_S = 0.1
_MAX_SLEEP_S = 1e-3

# Word indices (in units of cache lines) of the control block.
_W_MAGIC, _W_ABORT, _W_WRITERS, _W_READERS, _W_SLOT_BYTES, _W_SLOTS, _W_PIDNS, _W_NUM_SLOTS = range(8)
_FIRST_PEER = 8  # then per writer: pid, written; per reader: pid, read

_created: set[str] = set()  # names this process created and has not unlinked yet


class WeightSyncAborted(StrategyError):
    """A weight sync stopped midway because a participant failed or died; the message says which and why."""


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink_created() -> None:
    for name in list(_created):
        with contextlib.suppress(OSError):
            (SHM_DIR / name).unlink()
        _created.discard(name)


atexit.register(_unlink_created)


def sweep_stale_segments() -> list[str]:
    """Remove segments whose creator (same pid namespace) is dead and never unlinked them; returns their names."""
    removed = []
    namespace = _pid_namespace()
    with contextlib.suppress(OSError):
        for path in SHM_DIR.glob(f"{PREFIX}*"):
            parts = path.name[len(PREFIX) :].split("-")
            if len(parts) != 3 or not parts[0].isdigit() or parts[1] != str(namespace):
                continue
            if not _alive(int(parts[0])):
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed.append(path.name)
    if removed:
        logger.warning("removed %d weight-sync segments left by dead processes: %s", len(removed), removed)
    return removed


class SharedRing:
    """The mapped segment; build with :meth:`create` (one process) and :meth:`attach` (the others)."""

    def __init__(self, name: str, fd: int, created: bool) -> None:
        self.name = name
        self.created = created
        size = os.fstat(fd).st_size
        if size < _PAGE:
            os.close(fd)
            raise StrategyError(f"{SHM_DIR / name} is not a weight-sync segment (size {size})")
        try:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, size, flags=flags)
        finally:
            os.close(fd)
        head = np.frombuffer(self._mmap, dtype=np.int64, count=_FIRST_PEER * _LINE, offset=0)
        if int(head[_W_MAGIC * _LINE]) != _MAGIC:
            raise StrategyError(f"{self.path} is not a weight-sync segment")
        self.num_writers = int(head[_W_WRITERS * _LINE])
        self.num_readers = int(head[_W_READERS * _LINE])
        self.slot_bytes = int(head[_W_SLOT_BYTES * _LINE])
        self._host_slots = bool(head[_W_SLOTS * _LINE])
        self.num_slots = int(head[_W_NUM_SLOTS * _LINE])
        del head
        words = (_FIRST_PEER + 2 * (self.num_writers + self.num_readers)) * _LINE
        # The control words; None once closed (typed loosely so the hot paths index it without narrowing).
        self._ctrl: Any = np.frombuffer(self._mmap, dtype=np.int64, count=words, offset=0)
        self._writer_words = [_FIRST_PEER + 2 * i for i in range(self.num_writers)]
        self._reader_words = [_FIRST_PEER + 2 * (self.num_writers + i) for i in range(self.num_readers)]
        self._written = np.array([(w + 1) * _LINE for w in self._writer_words])
        self._read = np.array([(r + 1) * _LINE for r in self._reader_words])
        self.slots: list[torch.Tensor] = []
        if self._host_slots:
            start = self._header_bytes(self.num_writers, self.num_readers)
            # Through numpy: its array holds a buffer export of the mmap, so the mapping outlives close() for as
            # long as any view of a slot is alive (torch.frombuffer would let it be unmapped under the view).
            self.slots = [
                torch.from_numpy(
                    np.frombuffer(self._mmap, dtype=np.uint8, count=self.slot_bytes, offset=start + i * self.slot_bytes)
                )
                for i in range(self.num_slots)
            ]
        self._namespace = _pid_namespace()

    # --- layout -----------------------------------------------------------------------------------------
    @staticmethod
    def _header_bytes(num_writers: int, num_readers: int) -> int:
        words = (_FIRST_PEER + 2 * (num_writers + num_readers)) * _LINE * 8 + _MESSAGE_BYTES
        return (words + _PAGE - 1) // _PAGE * _PAGE

    @property
    def path(self) -> Path:
        return SHM_DIR / self.name

    @property
    def nbytes(self) -> int:
        return len(self._mmap)

    # --- lifecycle --------------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        *,
        num_writers: int,
        num_readers: int,
        slot_bytes: int,
        host_slots: bool = True,
        num_slots: int = NUM_SLOTS,
    ) -> SharedRing:
        """A new segment with ``num_slots`` slots of ``slot_bytes`` (page-aligned), counters at 0."""
        if num_slots < 1:
            raise ValueError(f"a ring needs at least one slot, got {num_slots}")
        if not SHM_DIR.is_dir():
            raise StrategyError(f"{SHM_DIR} does not exist: same-node weight sync needs POSIX shared memory")
        sweep_stale_segments()
        slot_bytes = (slot_bytes + _PAGE - 1) // _PAGE * _PAGE
        size = cls._header_bytes(num_writers, num_readers) + (num_slots * slot_bytes if host_slots else 0)
        name = f"{PREFIX}{os.getpid()}-{_pid_namespace()}-{uuid.uuid4().hex[:12]}"
        fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        _created.add(name)
        try:
            os.ftruncate(fd, size)
            head = np.zeros(_FIRST_PEER * _LINE, dtype=np.int64)
            head[_W_WRITERS * _LINE] = num_writers
            head[_W_READERS * _LINE] = num_readers
            head[_W_SLOT_BYTES * _LINE] = slot_bytes
            head[_W_SLOTS * _LINE] = int(host_slots)
            head[_W_NUM_SLOTS * _LINE] = num_slots
            head[_W_PIDNS * _LINE] = _pid_namespace()
            head[_W_MAGIC * _LINE] = _MAGIC
            os.pwrite(fd, head.tobytes(), 0)
        except BaseException:
            os.close(fd)
            cls._unlink_name(name)
            raise
        return cls(name, fd, created=True)

    @classmethod
    def attach(cls, name: str) -> SharedRing:
        try:
            fd = os.open(SHM_DIR / name, os.O_RDWR)
        except FileNotFoundError as e:
            raise StrategyError(
                f"weight-sync segment {name} is gone: its creator closed the channel or died, or this worker runs "
                "on another node than the sender (set the transport to 'collective' for such a layout)"
            ) from e
        return cls(name, fd, created=False)

    @staticmethod
    def _unlink_name(name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / name).unlink()
        _created.discard(name)

    def unlink(self) -> None:
        """Remove the name: processes that mapped the segment keep it; it is freed when the last one unmaps."""
        self._unlink_name(self.name)

    def close(self) -> None:
        if self.created:
            self.unlink()
        self.slots = []
        ctrl, self._ctrl = self._ctrl, None
        del ctrl
        try:
            self._mmap.close()
        except BufferError:
            # A view of a slot is still referenced (e.g. by an engine that kept a tensor): the mapping goes away
            # with that reference.
            logger.debug("weight-sync segment %s still has live views; it is unmapped when they are freed", self.name)

    # --- participants -----------------------------------------------------------------------------------
    def join(self, *, writer: int | None = None, reader: int | None = None) -> None:
        """Record this process as writer/reader number ``i`` (for the others' liveness checks)."""
        if writer is not None:
            self._ctrl[self._writer_words[writer] * _LINE] = os.getpid()
        if reader is not None:
            self._ctrl[self._reader_words[reader] * _LINE] = os.getpid()

    def _peer_pids(self) -> list[int]:
        if int(self._ctrl[_W_PIDNS * _LINE]) != self._namespace:
            return []  # another pid namespace: pids say nothing here
        words = self._writer_words + self._reader_words
        return [int(self._ctrl[w * _LINE]) for w in words if int(self._ctrl[w * _LINE]) not in (0, os.getpid())]

    # --- counters ---------------------------------------------------------------------------------------
    def written(self) -> int:
        """Buckets every writer has finished (the minimum over writers)."""
        return int(self._ctrl[self._written].min()) if self.num_writers else 0

    def read(self) -> int:
        """Buckets every reader has finished (the minimum over readers; unbounded without readers)."""
        return int(self._ctrl[self._read].min()) if self.num_readers else 1 << 62

    def publish_written(self, writer: int, count: int) -> None:
        self._publish((self._writer_words[writer] + 1) * _LINE, count)

    def publish_read(self, reader: int, count: int) -> None:
        self._publish((self._reader_words[reader] + 1) * _LINE, count)

    def _publish(self, word: int, count: int) -> None:
        # An aligned 8-byte store, then the wake: a waiter either sees the new value or is asleep on the old one.
        self._ctrl[word] = count
        _futex.wake(self._address(word))

    def wait_written(self, count: int, timeout_s: float) -> float:
        """Block until every writer finished ``count`` buckets; returns the seconds waited."""
        return self._wait(self._written, count, f"bucket {count - 1} from the writers", timeout_s)

    def wait_read(self, count: int, timeout_s: float) -> float:
        """Block until every reader finished ``count`` buckets; returns the seconds waited."""
        return self._wait(self._read, count, f"the readers to release bucket {count - 1}", timeout_s)

    def _lagging(self, words: np.ndarray, count: int) -> int | None:
        """The first of ``words`` (control-word indices) whose counter is below ``count``, or None."""
        for word in words.tolist():
            if int(self._ctrl[word]) < count:
                return int(word)
        return None

    def _wait(self, words: np.ndarray, count: int, what: str, timeout_s: float) -> float:
        start = time.perf_counter()
        if self._lagging(words, count) is None:
            self.check()
            return 0.0
        deadline, next_check, delay = start + timeout_s, start + _CHECK_PEERS_S, 2e-5
        while (word := self._lagging(words, count)) is not None:
            self.check()
            now = time.perf_counter()
            if now >= next_check:
                dead = [pid for pid in self._peer_pids() if not _alive(pid)]
                if dead:
                    self.abort(f"process {dead[0]} of the weight sync died while pid {os.getpid()} waited for {what}")
                    self.check()
                next_check = now + _CHECK_PEERS_S
            if now >= deadline:
                self.abort(f"pid {os.getpid()} waited {timeout_s:.0f} s for {what}")
                self.check()
            if _futex.AVAILABLE:
                # Sleep in the kernel until the lagging counter changes (its publisher wakes us) or the next check.
                value = int(self._ctrl[word])
                if value < count:
                    _futex.wait(self._address(word), value, min(next_check, deadline) - now)
            else:
                time.sleep(delay)
                delay = min(delay * 2, _MAX_SLEEP_S)
        return time.perf_counter() - start

    def _address(self, word: int) -> int:
        """Address of control word ``word`` (an int64; a futex watches its low half, little-endian)."""
        return int(self._ctrl.ctypes.data) + 8 * word

    # --- abort ------------------------------------------------------------------------------------------
    def abort(self, message: str) -> None:
        """Stop every participant's waits with ``message`` (the first abort's message is kept)."""
        if self._ctrl is None or int(self._ctrl[_W_ABORT * _LINE]):
            return
        offset = (_FIRST_PEER + 2 * (self.num_writers + self.num_readers)) * _LINE * 8
        data = message.encode()[: _MESSAGE_BYTES - 1]
        self._mmap[offset : offset + len(data) + 1] = data + b"\0"
        self._ctrl[_W_ABORT * _LINE] = 1
        for word in self._written.tolist() + self._read.tolist():  # every waiter sleeps on one of these
            _futex.wake(self._address(int(word)))

    @property
    def aborted(self) -> bool:
        return self._ctrl is not None and bool(self._ctrl[_W_ABORT * _LINE])

    def message(self) -> str:
        offset = (_FIRST_PEER + 2 * (self.num_writers + self.num_readers)) * _LINE * 8
        raw = bytes(self._mmap[offset : offset + _MESSAGE_BYTES])
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def check(self) -> None:
        if self.aborted:
            raise WeightSyncAborted(f"weight sync aborted: {self.message()}")
