"""Row gathers and concatenation of CPU tensors into numpy-allocated outputs.

numpy allocates large outputs with transparent huge pages (madvise), so filling a fresh 256 MiB buffer takes
~100 page faults instead of ~65,000. Measured on a 2-core VM: concatenating 256 MiB took 88 ms with numpy vs
618 ms with ``torch.cat``. Tensors that numpy cannot view (non-CPU, non-contiguous, or requiring grad) use torch.
Row gathers write into such an output with ``torch.index_select(..., out=)``, which uses all of torch's threads.

Concatenating many megabytes is bound by first-touch page faults of the fresh output (the kernel zeroes each page
before the copy lands on it), not by the copy itself. ``cat_rows_many`` therefore splits large copies into blocks
and runs them on up to ``torch.get_num_threads()`` threads, so the faults of different blocks are served by
different cores. A process limited to one thread (Ray actors get ``OMP_NUM_THREADS=1``) copies serially.

Even spread over cores, zeroing a fresh buffer costs about as much as the copy. Batches of similar shapes are
concatenated every step (the driver gathering worker outputs), so the memory of large outputs that have been freed
is kept in ``BufferCache`` and handed to the next output of about the same size, which then costs only the copy.
At most ``ROLL_BUFFER_CACHE_MB`` (default 1024; 0 turns reuse off) is kept; the oldest buffers go first.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numpy.typing import DTypeLike

__all__ = ["BufferCache", "buffer_cache", "cat_rows_many", "copy_arrays", "take_rows"]

# numpy has no bfloat16/float8: view such tensors as same-size integers and back.
_VIEW_AS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}

PARALLEL_COPY_MIN_BYTES = 16 << 20  # below this one thread copies (thread hand-off would cost more than it saves)
_BLOCK_BYTES = 4 << 20  # copies are cut into blocks of about this size before they are shared among threads

_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_pid = 0  # a forked child inherits the pool object but not its threads
_pool_lock = threading.Lock()


def _numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    if tensor.device.type != "cpu" or tensor.requires_grad or not tensor.is_contiguous() or tensor.dim() == 0:
        return None
    try:
        return tensor.view(_VIEW_AS.get(tensor.dtype, tensor.dtype)).numpy()
    except (TypeError, RuntimeError):
        return None


def _back(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(array).view(dtype)


def cat_rows_many(groups: Mapping[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``{key: torch.cat(tensors)}`` for every key, with all the copies of all keys shared among threads."""
    out: dict[str, torch.Tensor] = {}
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    for key, tensors in groups.items():
        arrays = [a for a in map(_numpy_view, tensors) if a is not None]
        if (
            len(arrays) != len(tensors)
            or len({t.dtype for t in tensors}) != 1
            or len({a.shape[1:] for a in arrays}) != 1
        ):
            out[key] = torch.cat(tensors)  # torch promotes dtypes, handles devices and explains bad shapes
            continue
        joined = buffer_cache().empty((sum(len(a) for a in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
        row = 0
        for array in arrays:
            copies.append((joined[row : row + len(array)], array))
            row += len(array)
        out[key] = _back(joined, tensors[0].dtype)
    copy_arrays(copies)
    return out


class _Slab:
    """One reusable buffer (identity equality, so it can sit in a deque)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


class BufferCache:
    """Large uninitialized arrays whose memory is recycled once the array handed out is garbage.

    ``empty(shape, dtype)`` works like ``np.empty``. For outputs of at least ``min_bytes`` it reuses a freed buffer
    of ``nbytes`` to about ``1.25 * nbytes`` when one is cached, else allocates one a little larger than asked (so a next
    output slightly longer still fits). When every tensor and array viewing the output is gone, its buffer returns
    to the cache; beyond ``capacity`` bytes the oldest cached buffers are freed.

    Hand the returned array itself to ``torch.from_numpy`` (a tensor and all its views then keep it alive). numpy
    slices of it point at the underlying buffer, not at it, so they must not outlive it.
    """

    def __init__(self, capacity: int, min_bytes: int = 8 << 20) -> None:
        self.capacity = capacity
        self.min_bytes = min_bytes
        # Finalizers append here from any thread, possibly while ``empty`` runs; deque appends are atomic.
        self._free: collections.deque[_Slab] = collections.deque()
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0

    @property
    def cached_bytes(self) -> int:
        return sum(slab.array.nbytes for slab in list(self._free))

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not self.min_bytes <= nbytes <= self.capacity:  # small, or too big to keep afterwards
            return np.empty(shape, dtype=dtype)
        slab = self._take(nbytes)
        if slab is None:
            slab = _Slab(np.empty(_rounded(nbytes * 17 // 16), dtype=np.uint8))
            self.allocated += 1
        else:
            self.reused += 1
        out = slab.array[:nbytes].view(dtype).reshape(shape)
        # ``out`` is what torch.from_numpy keeps alive: it dies with the last tensor or array viewing this memory.
        weakref.finalize(out, self._give, slab).atexit = False
        return out

    def clear(self) -> None:
        """Free every cached buffer."""
        with self._lock:
            self._free.clear()

    def _take(self, nbytes: int) -> _Slab | None:
        with self._lock:
            most = _rounded(nbytes * 5 // 4)
            fits = [s for s in list(self._free) if nbytes <= s.array.nbytes <= most]
            if not fits:
                return None
            best = min(fits, key=lambda s: s.array.nbytes)
            self._free.remove(best)
            return best

    def _give(self, slab: _Slab) -> None:
        self._free.append(slab)
        # A finalizer may run inside ``_take`` on this same thread: never wait for the lock here.
        if self._lock.acquire(blocking=False):
            try:
                while self._free and self.cached_bytes > self.capacity:
                    self._free.popleft()
            finally:
                self._lock.release()


def _rounded(nbytes: int) -> int:
    """Whole huge pages (2 MiB) for large buffers, whole pages below."""
    page = 2 << 20 if nbytes >= 2 << 20 else 4 << 10
    return -(-nbytes // page) * page


_cache: BufferCache | None = None


def buffer_cache() -> BufferCache:
    """The process-wide cache, sized from ``ROLL_BUFFER_CACHE_MB`` on first use."""
    global _cache
    if _cache is None:
        raw = os.environ.get("ROLL_BUFFER_CACHE_MB", "1024")
        try:
            megabytes = int(raw)
        except ValueError:
            raise ValueError(
                f"ROLL_BUFFER_CACHE_MB must be a whole number of MiB (0 turns reuse off), got {raw!r}"
            ) from None
        _cache = BufferCache(megabytes << 20)
    return _cache


def copy_arrays(copies: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """``np.copyto(dst, src)`` for every pair; large totals are cut into blocks shared among torch's threads."""
    total = sum(src.nbytes for _, src in copies)
    workers = min(torch.get_num_threads(), os.cpu_count() or 1)
    if workers < 2 or total < PARALLEL_COPY_MIN_BYTES:
        for dst, src in copies:
            np.copyto(dst, src)
        return
    blocks = [block for dst, src in copies for block in _blocks(dst, src)]
    # Contiguous runs of blocks of about equal bytes: each thread writes one region of each output.
    share, filled = total / workers, 0
    runs: list[list[tuple[np.ndarray, np.ndarray]]] = []
    run: list[tuple[np.ndarray, np.ndarray]] = []
    for dst, src in blocks:
        run.append((dst, src))
        filled += src.nbytes
        if filled >= share * (len(runs) + 1) and len(runs) < workers - 1:
            runs.append(run)
            run = []
    runs.append(run)
    pending = [_executor(workers).submit(_copy_run, r) for r in runs[1:]]
    _copy_run(runs[0])
    for future in pending:
        future.result()


def _blocks(dst: np.ndarray, src: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    row_bytes = max(1, src.nbytes // max(1, len(src)))
    rows = max(1, _BLOCK_BYTES // row_bytes)
    return [(dst[i : i + rows], src[i : i + rows]) for i in range(0, len(src), rows)]


def _copy_run(run: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in run:
        np.copyto(dst, src)  # releases the GIL


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_workers, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_workers < workers - 1 or _pool_pid != os.getpid():
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)  # work already queued there still runs
            _pool = ThreadPoolExecutor(workers - 1, thread_name_prefix="roll-copy")
            _pool_workers, _pool_pid = workers - 1, os.getpid()
        return _pool


def take_rows(tensor: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """``tensor.index_select(0, index)`` (``index``: int64, in range), into recycled memory when large."""
    positions = torch.from_numpy(index)
    array = _numpy_view(tensor)
    if array is None:
        return tensor.index_select(0, positions.to(tensor.device))
    out = buffer_cache().empty((len(index), *array.shape[1:]), array.dtype)
    # torch's gather shares the rows among its threads (np.take copies on one).
    torch.index_select(torch.from_numpy(array), 0, positions, out=torch.from_numpy(out))
    return _back(out, tensor.dtype)
