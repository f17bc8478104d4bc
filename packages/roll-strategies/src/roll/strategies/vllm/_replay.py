"""Replayed in-place loads: the copies vLLM's ``load_weights`` made for a bucket, redone without it.

A bucket with the same tensors (names, dtypes, shapes) arrives every sync. The first two times, the model's own
``load_weights`` loads it while a :class:`torch.overrides.TorchFunctionMode` records every ``copy_`` from a
bucket tensor into a parameter (the destination view, e.g. the q slice of a fused qkv weight, and which elements
of which bucket tensor it read). If both recordings are identical, later syncs replay them directly: one
``memmove`` per contiguous pair (streaming stores, or pieces where streaming would be slow: see
:mod:`roll.strategies.weight_sync.memcopy`), no name mapping or weight-loader Python per tensor.

A recording is only kept when every write into a parameter it saw was such a copy: another in-place op on a
parameter (``mul_``, ``__setitem__``, ``out=``...), a copy from a tensor the loader computed, bucket bytes copied
into a non-parameter, or a cast makes that bucket layout go through ``load_weights`` every time. Writes that
bypass torch's function dispatch (C code writing parameter memory directly) cannot be seen; the CPU in-place mode
only runs on unquantized plain layers, whose loaders copy with ``copy_``. Before a replay, each destination
parameter must still own the memory it had when recorded.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from roll.strategies.weight_sync.memcopy import CopyCounts, memmove_calls, run_memmoves

__all__ = ["ReplayCache"]

logger = logging.getLogger(__name__)

_Key = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]


@dataclass
class _Copy:
    dst: torch.Tensor  # a view of a parameter
    source: int  # index of the bucket tensor it reads
    offset: int  # element offset of the read view from that tensor's first element
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class _Recording:
    copies: list[_Copy]
    loaded: list[str]
    params: list[tuple[torch.Tensor, int]]  # (parameter, its data_ptr when recorded)
    confirmed: bool = False  # recorded twice, identically: replayed from now on


def _signature(copy: _Copy) -> tuple[int, tuple[int, ...], tuple[int, ...], int, int, tuple[int, ...], tuple[int, ...]]:
    dst = copy.dst
    return (dst.data_ptr(), tuple(dst.shape), tuple(dst.stride()), copy.source, copy.offset, copy.shape, copy.stride)


class _Recorder(TorchFunctionMode):
    """Records ``copy_`` calls from bucket tensors into parameters while ``load_weights`` runs."""

    def __init__(self, params: Sequence[tuple[int, int, torch.Tensor]], sources: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.params = params  # (start address, end address, parameter), sorted
        self.sources = sources
        self.copies: list[_Copy] = []
        self.problem: str | None = None
        self._starts = [start for start, _, _ in params]

    def param_of(self, tensor: torch.Tensor) -> torch.Tensor | None:
        address = tensor.data_ptr()
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and address < self.params[index][1]:
            return self.params[index][2]
        return None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = kwargs.get("out")
        for target in out if isinstance(out, tuple | list) else [out]:
            if isinstance(target, torch.Tensor) and self.param_of(target) is not None:
                self.problem = self.problem or "load_weights wrote a parameter through out="
        if func is torch.Tensor.copy_ and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            self._record(args[0], args[1])
        else:
            name = getattr(func, "__name__", "")
            in_place = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"
            if in_place and args and isinstance(args[0], torch.Tensor) and self.param_of(args[0]) is not None:
                self.problem = self.problem or f"load_weights ran {name} on a parameter"
        return func(*args, **kwargs)

    def _record(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.param_of(dst) is None:
            if self._source_of(src) is not None:
                self.problem = self.problem or "load_weights copied bucket bytes into a tensor that is no parameter"
            return
        found = self._source_of(src)
        if found is None:
            self.problem = self.problem or "load_weights copied a computed tensor into a parameter"
            return
        index, offset = found
        if dst.shape != src.shape or dst.dtype != src.dtype:
            self.problem = self.problem or "load_weights broadcast or cast while copying into a parameter"
            return
        self.copies.append(_Copy(dst, index, offset, tuple(src.shape), tuple(src.stride())))

    def _source_of(self, src: torch.Tensor) -> tuple[int, int] | None:
        """(bucket tensor index, element offset) of a view that lies inside one bucket tensor of the same dtype."""
        address = src.data_ptr()
        for index, tensor in enumerate(self.sources):
            start = tensor.data_ptr()
            if start <= address < start + tensor.numel() * tensor.element_size() and src.dtype == tensor.dtype:
                span = sum((size - 1) * abs(step) for size, step in zip(src.shape, src.stride())) + 1
                offset, rest = divmod(address - start, tensor.element_size())
                if rest or offset + span > tensor.numel():
                    return None
                return index, offset
        return None


class ReplayCache:
    """Per engine worker: the recorded copies of each bucket layout (None: that layout is not replayable)."""

    def __init__(self) -> None:
        self._recordings: dict[_Key, _Recording | None] = {}
        self.memmoves = CopyCounts()  # replayed copies done by memmove (whole, or split to dodge 4K aliasing)
        self.torch_copies = 0  # replayed copies that needed torch's copy_ (strided or off-host pairs)

    def counts(self) -> tuple[int, int]:
        """(bucket layouts that replay, layouts that always go through ``load_weights``); others are being recorded."""
        replayable = sum(recording is not None and recording.confirmed for recording in self._recordings.values())
        never = sum(recording is None for recording in self._recordings.values())
        return replayable, never

    def load(
        self,
        model: torch.nn.Module,
        named_tensors: Sequence[tuple[str, torch.Tensor]],
        load_weights: Callable[[Sequence[tuple[str, torch.Tensor]]], list[str]],
    ) -> list[str]:
        """Load one bucket: replay its recorded copies, or run ``load_weights`` (recording the first two times)."""
        key: _Key = tuple((name, t.dtype, tuple(t.shape)) for name, t in named_tensors)
        known = key in self._recordings
        recording = self._recordings.get(key)
        if known and recording is None:
            return load_weights(named_tensors)
        if recording is not None and not all(param.data_ptr() == address for param, address in recording.params):
            # Also between the two recordings (e.g. engines re-bound to new shared weights): compared with the old
            # one, the new recording would differ and the layout would never replay.
            logger.info("a parameter of the engine moved since its weight-sync copies were recorded; recording again")
            recording = None
        if recording is not None and recording.confirmed:
            return self._replay(recording, named_tensors)
        return self._record(key, model, named_tensors, load_weights, recording)

    def _record(
        self,
        key: _Key,
        model: torch.nn.Module,
        named_tensors: Sequence[tuple[str, torch.Tensor]],
        load_weights: Callable[[Sequence[tuple[str, torch.Tensor]]], list[str]],
        previous: _Recording | None,
    ) -> list[str]:
        by_name = dict(model.named_parameters(remove_duplicate=False))
        spans = sorted(
            (p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), p) for p in by_name.values() if p.numel()
        )
        recorder = _Recorder(spans, [t for _, t in named_tensors])
        with recorder:
            loaded = load_weights(named_tensors)
        problem = recorder.problem
        params = [by_name[name] for name in loaded if name in by_name]
        if problem is None and len(params) != len(loaded):
            problem = "load_weights reported parameters the model does not list"
        unique = {_signature(c): c for c in recorder.copies}
        if problem is None and previous is not None and set(unique) != {_signature(c) for c in previous.copies}:
            problem = "load_weights copied differently on two syncs of the same bucket layout"
        if problem is not None:
            logger.info("weight sync: bucket %s loads through load_weights every time: %s", key[0][0], problem)
            self._recordings[key] = None
        else:
            self._recordings[key] = _Recording(
                list(unique.values()), loaded, [(p, p.data_ptr()) for p in params], confirmed=previous is not None
            )
        return loaded

    def _replay(self, recording: _Recording, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[str]:
        pairs: list[tuple[int, int, int]] = []  # plain host copies, run in order before any torch copy
        with torch.no_grad():
            for copy in recording.copies:
                base = named_tensors[copy.source][1]
                src = base.as_strided(copy.shape, copy.stride, base.storage_offset() + copy.offset)
                dst = copy.dst
                if dst.is_contiguous() and src.is_contiguous() and dst.device.type == "cpu" == src.device.type:
                    pairs.append((dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size()))
                    continue
                run_memmoves(memmove_calls(pairs, counts=self.memmoves))
                pairs = []
                dst.copy_(src)
                self.torch_copies += 1
        run_memmoves(memmove_calls(pairs, counts=self.memmoves))
        return list(recording.loaded)
