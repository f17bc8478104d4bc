"""Weight writers: how the ranks of a training role put full tensors into bucket slots.

A writer lists the tensors it will produce (:attr:`WeightWriter.specs`, identical on every rank) and fills them
bucket by bucket. Two modes, chosen per channel by the sender from the topology:

* ``local=True``: every rank maps the same slot (same node) and writes only the parts it owns (its shards); no
  collective, no byte crosses a socket. Needs :attr:`WeightWriter.writes_shards`.
* ``local=False``: the ranks gather full tensors together (a collective) and rank 0 copies them into the slot;
  the other ranks pass ``out=None``.

:class:`GatheredWriter` implements the second mode for any :class:`~roll.strategies.TrainStrategy` from its
``named_weights()``; backends with sharded parameters provide a writer of their own (fsdp2).
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from roll.strategies.base import StrategyError
from roll.strategies.weight_sync.memcopy import NON_TEMPORAL_THRESHOLD, memmove_calls, run_memmoves, weight_sync_env
from roll.strategies.weight_sync.plan import TensorSpec

__all__ = ["NON_TEMPORAL_THRESHOLD", "GatheredWriter", "WeightWriter", "WriteStats", "copy_into", "weight_sync_env"]


@dataclass
class WriteStats:
    """Seconds spent producing full tensors (collectives, LoRA merges) and copying into the slot, and bytes copied."""

    gather_s: float = 0.0
    pack_s: float = 0.0
    bytes: int = 0

    def add(self, other: WriteStats) -> None:
        self.gather_s += other.gather_s
        self.pack_s += other.pack_s
        self.bytes += other.bytes


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Copies on one thread: a bucket's many tensor copies each open an OpenMP parallel region otherwise, and on a
    busy machine (sender and receivers share the cores) those cost 2-3x the CPU of plain memcpy (measured)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _memcpy_pairs(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> list[tuple[int, int, int]] | None:
    """(dst address, src address, bytes) per pair when every pair is a plain host copy (same dtype and shape,
    both contiguous), else None."""
    pairs = []
    for dst, src in zip(dsts, srcs):
        if (
            dst.dtype != src.dtype
            or dst.device.type != "cpu"
            or src.device.type != "cpu"
            or dst.shape != src.shape
            or not dst.is_contiguous()
            or not src.is_contiguous()
        ):
            return None
        pairs.append((dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size()))
    return pairs


def copy_into(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> int:
    """Copy each source into its destination (casting dtype, crossing devices) in one call; returns bytes written.

    Plain host copies go through the C library's ``memmove`` (one call per tensor, on this thread, without the
    GIL): unlike torch's copy kernel it switches to non-temporal stores for large copies, which write a bucket
    slot (memory that another process reads next, not this core) at about half the CPU cost; a pair whose
    addresses would make that streaming copy slow is copied in pieces (:mod:`.memcopy`).
    """
    if not dsts:
        return 0
    pairs = _memcpy_pairs(dsts, srcs)
    if pairs is not None:
        return run_memmoves(memmove_calls(pairs))
    same = all(d.dtype == s.dtype and d.device == s.device for d, s in zip(dsts, srcs))
    on_host = all(d.device.type == "cpu" and s.device.type == "cpu" for d, s in zip(dsts, srcs))
    with torch.no_grad(), _one_thread() if on_host else contextlib.nullcontext():
        if same:
            torch._foreach_copy_(list(dsts), list(srcs))
        else:
            for dst, src in zip(dsts, srcs):
                dst.copy_(src)
    return sum(d.numel() * d.element_size() for d in dsts)


class WeightWriter(ABC):
    """Produces a training role's full weights into caller-provided tensors, in :attr:`specs` order."""

    specs: list[TensorSpec]
    writes_shards: bool = False

    @abstractmethod
    def write(self, start: int, stop: int, out: Sequence[torch.Tensor] | None, *, local: bool) -> WriteStats:
        """Fill ``out[i]`` with tensor ``specs[start + i]``; every rank calls this for the same range.

        ``local``: ``out`` is the same memory on every rank and each rank writes the parts it owns. Otherwise it is
        a collective; rank 0 passes ``out`` and the other ranks ``None``. Calls cover the specs in order.
        """

    def finish(self) -> None:  # noqa: B027 - optional hook
        """Called once after the last bucket of a sync (or after a failure) to release per-sync state."""


class GatheredWriter(WeightWriter):
    """A writer over ``named_weights()`` (a collective generator; only rank 0's tensors are meaningful).

    The specs come from one pass over the weights when the writer is built (once per channel).
    """

    def __init__(self, named_weights: Callable[[], Iterator[tuple[str, torch.Tensor]]]) -> None:
        self._named_weights = named_weights
        self.specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in named_weights()]
        self._iterator: Iterator[tuple[str, torch.Tensor]] | None = None
        self._position = 0

    def write(self, start: int, stop: int, out: Sequence[torch.Tensor] | None, *, local: bool) -> WriteStats:
        if local:
            raise StrategyError("this training backend gathers full tensors; it cannot write shards in place")
        if start == 0 or self._iterator is None:
            self._iterator, self._position = self._named_weights(), 0
        if start != self._position:
            raise StrategyError(f"weight writer asked for tensors {start}:{stop} but is at {self._position}")
        stats = WriteStats()
        for index in range(start, stop):
            began = time.perf_counter()
            try:
                name, tensor = next(self._iterator)
            except StopIteration:
                raise StrategyError(
                    f"named_weights() ended after {index} tensors; the plan has {len(self.specs)}"
                ) from None
            stats.gather_s += time.perf_counter() - began
            spec = self.specs[index]
            if name != spec.name or tuple(tensor.shape) != spec.shape:
                raise StrategyError(
                    f"named_weights() gave {name} {tuple(tensor.shape)} where the sync plan has {spec.name} "
                    f"{spec.shape}: the weights must come in the same order every time"
                )
            if out is not None:
                began = time.perf_counter()
                stats.bytes += copy_into([out[index - start]], [tensor])
                stats.pack_s += time.perf_counter() - began
        self._position = stop
        if stop == len(self.specs):
            self.finish()
        return stats

    def finish(self) -> None:
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "close"):
            iterator.close()
        self._position = 0
