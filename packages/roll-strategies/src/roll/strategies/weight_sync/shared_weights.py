"""Engines on one node that share one copy of their weights: the leader loads each sync, the others wait for it.

Two inference engines of the same model on one node (data-parallel replicas) each keep a full copy of the weights,
and each copies every bucket of a sync into its copy: on a small machine the second receiver then costs a second
pass over the model's bytes through the same memory bus. Engines whose strategy offers a share key
(:meth:`InferenceStrategy.weight_share_key`, equal for the same parameter layout) can instead keep their
parameters in one ``/dev/shm`` segment: the leader (the lowest rank of such a group, a ring reader) copies its
weights into the segment and rebinds its parameters to views of it; the followers map the same segment and rebind
theirs. A sync then reaches the ring readers only; a follower waits until the leader has loaded the whole sync
and finishes its own engine's reload (e.g. drops its prefix cache).

Segment: one page of control words (int64), then the parameters in the strategy's order, each at a page-aligned
offset. Control: ``state`` (the leader is filling the segment, filled it, or failed to: followers stop waiting),
one word per follower (its pid once it re-bound its engine, -1 if it failed to; the leader removes the name once
all have), ``done`` (syncs the leader completed), ``failed``/``torn`` (the last sync the leader failed, and
whether its engine had loaded part of it). A follower of a torn sync is
fenced like a receiver that failed midway (its weights are the leader's, half-updated); one whose leader failed
before loading anything keeps the old weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll.strategies.base import StrategyError
from roll.strategies.weight_sync import ring as _ring

__all__ = [
    "SHARE_HEADER_BYTES",
    "SharedWeights",
    "SharedWeightsTorn",
    "adopt_shared_weights",
    "page_align_parameters",
    "rebind_parameters",
    "share_name",
    "shared_layout",
]

SHARE_HEADER_BYTES = mmap.PAGESIZE
# Every parameter starts on a page: bucket tensors sit at page offsets that are mostly multiples of 1 KiB, so the
# leader's copies from a slot then stay out of the 4K-aliasing band of streaming stores (see .memcopy).
_ALIGN = 4096
_LINE = 8
_W_MAGIC, _W_STATE, _W_DONE, _W_FAILED, _W_TORN, _W_LEADER_PID = range(6)  # in lines of the control page
_READY, _FAILED = 1, -1  # _W_STATE: 0 while the leader fills the segment
_FIRST_FOLLOWER_WORD = 8 * _LINE  # then one int64 per follower: its pid once attached, -1 if it failed to
_MAX_FOLLOWERS = SHARE_HEADER_BYTES // 8 - _FIRST_FOLLOWER_WORD
_MAGIC = 0x524F4C4C5357  # "ROLLSW"
_POLL_S = 2e-4
_MAX_POLL_S = 2e-3


def _aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


def shared_layout(params: Sequence[tuple[str, torch.Tensor]]) -> tuple[str, int] | None:
    """(layout key, bytes) of ``params`` laid out in order at page-aligned offsets; None when one of them is not
    a contiguous CPU tensor (then the engine cannot share)."""
    digest, offset = hashlib.sha256(), 0
    for name, param in params:
        if param.device.type != "cpu" or param.is_meta or not param.is_contiguous():
            return None
        digest.update(f"{name}|{param.dtype}|{tuple(param.shape)};".encode())
        offset = _aligned(offset) + param.numel() * param.element_size()
    return digest.hexdigest()[:24], _aligned(offset)


def rebind_parameters(params: Sequence[tuple[str, torch.Tensor]], buffer: torch.Tensor, *, fill: bool) -> None:
    """Rebind each parameter's ``.data`` to its view of the byte tensor ``buffer`` (the layout of
    :func:`shared_layout`, from the buffer's first byte), copying the current values in first when ``fill``. Tied
    parameters are one object, listed once, and stay one."""
    offset = 0
    with torch.no_grad():
        for _, param in params:
            offset = _aligned(offset)
            nbytes = param.numel() * param.element_size()
            view = buffer[offset : offset + nbytes].view(param.dtype).view(param.shape)
            if fill:
                view.copy_(param.data)
            param.data = view
            offset += nbytes


def adopt_shared_weights(params: Sequence[tuple[str, torch.Tensor]], path: str, start: int, *, fill: bool) -> None:
    """:func:`rebind_parameters` onto the file ``path`` from byte ``start`` (a shared-weights segment)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    # Views through numpy keep the mapping alive for as long as any parameter holds one.
    rebind_parameters(params, torch.from_numpy(np.frombuffer(mapping, dtype=np.uint8))[start:], fill=fill)


def page_align_parameters(params: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Move CPU parameters into one private buffer where each starts on a page (the :func:`shared_layout`), so
    copies into them from bucket slots stay clear of 4K aliasing; a no-op where :func:`shared_layout` is None."""
    layout = shared_layout(params)
    if layout is None:
        return
    raw = torch.empty(layout[1] + _ALIGN, dtype=torch.uint8)
    skip = -raw.data_ptr() % _ALIGN
    rebind_parameters(params, raw[skip : skip + layout[1]], fill=True)


class SharedWeightsTorn(StrategyError):
    """The leader's engine failed after loading part of a sync: the shared weights are half-updated."""


def share_name(ring_name: str, leader: int) -> str:
    """The segment of the group led by receiver ``leader`` on the channel whose ring is ``ring_name``.

    It carries the ring's creator pid, so a segment left by a channel whose sender died is swept like the ring's.
    """
    return f"{ring_name}w{leader}"


class SharedWeights:
    """The control words of a shared-weights segment (the weights themselves are mapped by the engines)."""

    def __init__(self, name: str, fd: int, created: bool) -> None:
        self.name, self.created = name, created
        try:
            self._mmap = mmap.mmap(fd, SHARE_HEADER_BYTES)
        finally:
            os.close(fd)
        self._ctrl: Any = np.frombuffer(self._mmap, dtype=np.int64)

    @property
    def path(self) -> Path:
        return _ring.SHM_DIR / self.name

    @classmethod
    def create(cls, name: str, followers: int) -> SharedWeights:
        """Leader: a new segment, its control page only (:meth:`reserve` sizes it); followers can open it from now."""
        if followers > _MAX_FOLLOWERS:
            raise StrategyError(
                f"{followers + 1} engines cannot share one copy of weights (at most {_MAX_FOLLOWERS + 1})"
            )
        fd = os.open(_ring.SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        _ring._created.add(name)
        try:
            os.ftruncate(fd, SHARE_HEADER_BYTES)
        except BaseException:
            os.close(fd)
            _ring.SharedRing._unlink_name(name)
            raise
        shared = cls(name, fd, created=True)
        shared._ctrl[_W_LEADER_PID * _LINE] = os.getpid()
        shared._ctrl[_W_MAGIC * _LINE] = _MAGIC
        return shared

    def reserve(self, weight_bytes: int) -> None:
        """Leader: grow the segment to hold ``weight_bytes`` of parameters, if ``/dev/shm`` has the room (tmpfs
        grows a file past its free space and faults on the first write that finds none)."""
        stat = os.statvfs(_ring.SHM_DIR)
        free = stat.f_bavail * stat.f_frsize
        if weight_bytes > free:
            raise StrategyError(
                f"{_ring.SHM_DIR} has {free / 2**30:.1f} GiB free, the shared weights need {weight_bytes / 2**30:.1f} "
                "GiB: enlarge it, or set share_weights_on_node: false on the inference role"
            )
        os.truncate(self.path, SHARE_HEADER_BYTES + weight_bytes)

    @classmethod
    def attach(cls, name: str, timeout_s: float) -> SharedWeights:
        """Follower: map the leader's segment once it is filled (waits up to ``timeout_s`` for it to appear and
        fill; fails at once if the leader failed to fill it, within ~0.1 s if the leader's process died)."""
        deadline = time.perf_counter() + timeout_s
        while True:
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(_ring.SHM_DIR / name, os.O_RDWR)
                if os.fstat(fd).st_size < SHARE_HEADER_BYTES:
                    os.close(fd)
                else:
                    shared = cls(name, fd, created=False)
                    magic, state, leader = (shared._word(w) for w in (_W_MAGIC, _W_STATE, _W_LEADER_PID))
                    if magic == _MAGIC and state == _READY:
                        return shared
                    shared.close()
                    if magic == _MAGIC and state == _FAILED:
                        raise StrategyError(f"the engine leading shared weights {name} failed to fill them")
                    if magic == _MAGIC and not _ring._alive(leader):
                        raise StrategyError(f"the engine leading shared weights {name} (pid {leader}) died")
            if time.perf_counter() >= deadline:
                raise StrategyError(f"the engine leading shared weights {name} did not fill them in {timeout_s:.0f} s")
            time.sleep(0.01)

    @classmethod
    def refuse(cls, name: str, follower: int) -> None:
        """Follower that could not attach: tell the leader (if its segment is there), so it stops waiting."""
        with contextlib.suppress(OSError):
            fd = os.open(_ring.SHM_DIR / name, os.O_RDWR)
            if os.fstat(fd).st_size < SHARE_HEADER_BYTES:
                os.close(fd)
                return
            shared = cls(name, fd, created=False)
            shared.mark_attached(follower, ok=False)
            shared.close()

    def _word(self, word: int) -> int:
        return int(self._ctrl[word * _LINE])

    # --- setup ------------------------------------------------------------------------------------------
    def mark_ready(self, ok: bool = True) -> None:
        """Leader: the segment holds its weights (or, ``ok=False``, never will: followers stop waiting)."""
        self._ctrl[_W_STATE * _LINE] = _READY if ok else _FAILED

    def mark_attached(self, follower: int, ok: bool = True) -> None:
        """Follower number ``follower`` (0-based) re-bound its engine to the segment (or failed to)."""
        self._ctrl[_FIRST_FOLLOWER_WORD + follower] = os.getpid() if ok else -1

    def wait_attached(self, followers: int, timeout_s: float) -> None:
        """Leader: wait until ``followers`` engines re-bound to the segment, then remove its name."""
        deadline = time.perf_counter() + timeout_s
        while True:
            words = [int(w) for w in self._ctrl[_FIRST_FOLLOWER_WORD : _FIRST_FOLLOWER_WORD + followers]]
            if -1 in words:
                raise StrategyError(f"follower {words.index(-1)} of shared weights {self.name} failed to attach")
            if all(words):
                break
            if time.perf_counter() >= deadline:
                raise StrategyError(
                    f"{followers} engines were to share the weights in {self.name}; "
                    f"{sum(map(bool, words))} attached within {timeout_s:.0f} s"
                )
            time.sleep(0.005)
        self.unlink()

    # --- syncs ------------------------------------------------------------------------------------------
    def mark_done(self, sync: int) -> None:
        """Leader: sync number ``sync`` (0-based, per channel) is loaded and finished."""
        self._ctrl[_W_DONE * _LINE] = sync + 1

    def mark_failed(self, sync: int, *, torn: bool) -> None:
        """Leader: sync ``sync`` failed; ``torn`` if the engine had loaded part of it."""
        self._ctrl[_W_TORN * _LINE] = int(torn)
        self._ctrl[_W_FAILED * _LINE] = sync + 1

    def wait_done(self, sync: int, timeout_s: float) -> float:
        """Follower: block until the leader finished sync ``sync``; returns the seconds waited.

        Raises :class:`SharedWeightsTorn` if the leader failed it after loading part of it, or if the leader's
        process died (its progress is unknown), and :class:`StrategyError` if it failed before loading anything or
        ``timeout_s`` passed.
        """
        start = time.perf_counter()
        delay, leader = _POLL_S, self._word(_W_LEADER_PID)
        next_check = start + 0.1
        while self._word(_W_DONE) < sync + 1:
            if self._word(_W_FAILED) >= sync + 1:
                if self._word(_W_TORN):
                    raise SharedWeightsTorn(f"the engine this one shares weights with (pid {leader}) failed midway")
                raise StrategyError(f"the engine this one shares weights with (pid {leader}) failed this sync")
            now = time.perf_counter()
            if now >= next_check:
                if not _ring._alive(leader):
                    raise SharedWeightsTorn(f"the engine this one shares weights with (pid {leader}) died")
                next_check = now + 0.1
            if now - start >= timeout_s:
                raise StrategyError(f"waited {timeout_s:.0f} s for the engine sharing these weights (pid {leader})")
            time.sleep(delay)
            delay = min(delay * 2, _MAX_POLL_S)
        return time.perf_counter() - start

    # --- teardown ---------------------------------------------------------------------------------------
    def unlink(self) -> None:
        _ring.SharedRing._unlink_name(self.name)

    def close(self, *, unlink: bool = True) -> None:
        """Unmap the control page; the leader also removes the name, unless ``unlink=False`` (a failed setup keeps
        it so followers still polling for it see the failure; the process's exit or the sweep of the channel's
        segments removes it)."""
        if self.created and unlink:
            self.unlink()
        ctrl, self._ctrl = self._ctrl, None
        del ctrl
        with contextlib.suppress(BufferError):
            self._mmap.close()
