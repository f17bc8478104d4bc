"""Plain host copies of weight sync: one C ``memmove`` per tensor, streaming where streaming is fast.

Why memmove: unlike torch's copy kernel, glibc's switches to non-temporal (streaming) stores for copies of at least
its ``x86_non_temporal_threshold``. A streaming store does not read the destination line first, so a large copy
costs about half the CPU of one with ordinary stores. glibc sizes that threshold from the last-level cache (192 MiB
on a VM that reports a 256 MiB L3), so per-tensor copies (<= 64 MB) never streamed: :func:`weight_sync_env` lowers
it to :data:`NON_TEMPORAL_THRESHOLD` for the processes that sync weights (measured on the 2-core EPYC VM, 416 MiB
in 64 MB buckets: 52-56 ms CPU with ordinary stores, 29-37 ms streaming, one flat 416 MiB memcpy 28-31 ms).

Why not always: a streaming copy whose destination lies a little ahead of its source within a 4 KiB page,
``0 < (dst - src) % 4096 < ALIAS_BAND``, runs 2.5-4.7x slower than the same copy at any other offset (measured on
that VM, glibc 2.36, AVX2: 64 MiB in 8 MiB pieces took 15-18 ms at offsets 1-320, 9-11 ms at 384-576, 4.3-5.5 ms
at 640-832, 3.7-3.9 ms at 0 and from 896 on; ordinary stores took 6.5-7 ms at every offset). The loads of the
source then alias the pending stores of the destination (4K aliasing). Weight-sync slots hold tensors at page
offsets that are multiples of 64 (mostly 0) while an engine's parameters sit at any 64-byte offset, so about a
third of the receiver's copies fell into that band and its load cost 2.5x memcpy. :func:`memmove_calls` copies
a pair closer than :data:`ALIAS_BAND` in pieces below the threshold instead (ordinary stores: ~1.7x a good
streaming copy, not 2.4-4.7x).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "ALIAS_BAND",
    "NON_TEMPORAL_THRESHOLD",
    "CopyCounts",
    "aliased",
    "memmove_calls",
    "run_memmoves",
    "streaming_threshold",
    "weight_sync_env",
]

# From this size on, glibc's memcpy in processes that sync weights uses non-temporal stores (see weight_sync_env).
NON_TEMPORAL_THRESHOLD = 1 << 20
# A streaming copy whose destination is 1..ALIAS_BAND-1 bytes ahead of its source (mod 4 KiB) costs 2.4-4.7x a good
# one, more than the ~1.7x of ordinary stores; from 640 on it costs at most 1.45x (measured, see above).
ALIAS_BAND = 640
_PAGE = 4096
_TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
# Pieces of an aliased copy: below any threshold a process is likely to run with, so glibc uses ordinary stores.
# glibc's own minimum is 0x4040; ordinary-store copies cost the same per byte from 256 KiB to 1 MiB pieces.
_MAX_PIECE = 512 << 10
_MIN_PIECE = 16 << 10


def weight_sync_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables for worker processes that sync weights (give them at process start).

    ``GLIBC_TUNABLES`` lowers glibc's non-temporal threshold for memcpy to :data:`NON_TEMPORAL_THRESHOLD` (see the
    module docstring). glibc reads the variable when the process starts; other C libraries and non-x86 machines
    ignore it. A threshold already set in ``environ`` (default: ``os.environ``) is kept; set it there to opt out.
    """
    current = (os.environ if environ is None else environ).get("GLIBC_TUNABLES", "")
    if "x86_non_temporal_threshold" in current:
        return {}
    tunable = f"{_TUNABLE}={NON_TEMPORAL_THRESHOLD:#x}"
    return {"GLIBC_TUNABLES": f"{current}:{tunable}" if current else tunable}


def streaming_threshold(environ: Mapping[str, str] | None = None) -> int | None:
    """The non-temporal threshold ``GLIBC_TUNABLES`` sets in ``environ`` (default: this process's), or None."""
    current = (os.environ if environ is None else environ).get("GLIBC_TUNABLES", "")
    for item in current.split(":"):
        name, _, value = item.partition("=")
        if name.strip() == _TUNABLE:
            try:
                return int(value.strip(), 0)
            except ValueError:
                return None
    return None


def _piece_bytes(threshold: int | None) -> int:
    if threshold is None:
        return _MAX_PIECE
    return max(_MIN_PIECE, min(_MAX_PIECE, (threshold - 1) // _PAGE * _PAGE))


_PIECE = _piece_bytes(streaming_threshold())  # glibc read this process's tunables at start


def aliased(dst: int, src: int) -> bool:
    """Whether a streaming copy from address ``src`` to ``dst`` falls into the slow 4K-aliasing band."""
    return 0 < (dst - src) % _PAGE < ALIAS_BAND


@dataclass
class CopyCounts:
    """How :func:`memmove_calls` copied: pairs copied whole, pairs split to dodge 4K aliasing, and bytes."""

    whole: int = 0
    split: int = 0
    bytes: int = 0

    def add(self, other: CopyCounts) -> None:
        self.whole += other.whole
        self.split += other.split
        self.bytes += other.bytes


def memmove_calls(
    pairs: Iterable[tuple[int, int, int]], *, piece: int | None = None, counts: CopyCounts | None = None
) -> list[tuple[int, int, int]]:
    """The ``memmove`` calls that copy each ``(dst address, src address, bytes)`` pair: one per pair, or pieces of
    ``piece`` bytes (default: below this process's streaming threshold) for a large pair whose addresses alias."""
    piece = _PIECE if piece is None else piece
    calls = []
    for dst, src, nbytes in pairs:
        if counts is not None:
            counts.bytes += nbytes
        if nbytes <= piece or not aliased(dst, src):
            calls.append((dst, src, nbytes))
            if counts is not None:
                counts.whole += 1
            continue
        calls.extend((dst + at, src + at, min(piece, nbytes - at)) for at in range(0, nbytes, piece))
        if counts is not None:
            counts.split += 1
    return calls


def run_memmoves(calls: Iterable[tuple[int, int, int]]) -> int:
    """Run ``memmove(dst, src, bytes)`` for each call (on this thread, without the GIL); returns bytes copied."""
    total = 0
    for dst, src, nbytes in calls:
        ctypes.memmove(dst, src, nbytes)
        total += nbytes
    return total
