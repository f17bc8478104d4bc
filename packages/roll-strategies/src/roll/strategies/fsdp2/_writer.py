"""The fsdp2 weight writer: each rank copies the shards it owns straight into the shared bucket slot.

With every rank on the slot's node (``local=True``) no tensor is gathered: a rank's ``Shard(0)`` piece of a
parameter is a contiguous run of rows of the full tensor, so it lands at its final byte offset with one copy
(cast to the sync dtype on the way). Otherwise (``local=False``) the ranks all-gather each full tensor and rank 0
copies it. LoRA-wrapped models always gather, since a merged weight needs the full adapter matrices.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from roll.strategies.fsdp2._model import hf_model, reshard
from roll.strategies.fsdp2._weights import _LM_HEAD, _lora_layers, iter_full_weights
from roll.strategies.weight_sync.plan import TensorSpec
from roll.strategies.weight_sync.writer import GatheredWriter, WeightWriter, WriteStats, copy_into

__all__ = ["Fsdp2WeightWriter"]


def _cast_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def _sources(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(HF name, sharded value) in ``iter_full_weights`` order, the tied LM head last; no communication. The values
    are the model's own parameters and buffers (not detached copies)."""
    reshard(model)
    base = hf_model(model)
    out = list(base.state_dict(keep_vars=True).items())
    if not any(name == _LM_HEAD for name, _ in out):
        get_embeddings = getattr(base, "get_input_embeddings", None)
        if callable(get_embeddings) and getattr(base.config, "tie_word_embeddings", False):
            out.append((_LM_HEAD, get_embeddings().weight))
    return out


def _owners(base: nn.Module, sources: list[tuple[str, torch.Tensor]]) -> list[tuple[nn.Module, str]] | None:
    """The (module, attribute) holding each source, or None when one is not an attribute of the module its name
    gives (a state-dict hook renamed it): then every sync asks the state dict again."""
    owners = []
    for name, value in sources:
        path, _, attr = name.rpartition(".")
        try:
            module = base.get_submodule(path)
        except AttributeError:
            return None
        if getattr(module, attr, None) is not value:
            return None
        owners.append((module, attr))
    return owners


def _local_piece(value: torch.Tensor, full: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(destination view of ``full``, source) for the part of ``value`` this rank writes, or None."""
    if not isinstance(value, DTensor):
        return (full, value) if rank == 0 else None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = value.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    # A replicated mesh dimension has the same values on every coordinate: only coordinate 0 writes them.
    if any(isinstance(p, Replicate) and c != 0 for p, c in zip(value.placements, coordinate)):
        return None
    local = value.to_local()
    if local.numel() == 0:
        return None
    shape, offset = compute_local_shape_and_global_offset(value.shape, mesh, value.placements)
    if tuple(shape) != tuple(local.shape):
        raise RuntimeError(f"local shard of shape {tuple(local.shape)} where the placement gives {tuple(shape)}")
    dst = full
    for dim, (size, start) in enumerate(zip(shape, offset)):
        if size != full.shape[dim]:
            dst = dst.narrow(dim, start, size)
    return dst, local


class Fsdp2WeightWriter(WeightWriter):
    """Full HF-named weights of a fully-sharded model, cast to ``dtype`` (floating tensors only)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None) -> None:
        self._model = model
        self._dtype = dtype
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        lora = _lora_layers(hf_model(model))
        self.writes_shards = not lora
        self._gathered: GatheredWriter | None = None
        if lora:
            self._gathered = GatheredWriter(lambda: iter_full_weights(model, dtype))
            self.specs = self._gathered.specs
            self._owners: list[tuple[nn.Module, str]] | None = None
        else:
            sources = _sources(model)
            self.specs = [TensorSpec(name, _cast_dtype(value, dtype), tuple(value.shape)) for name, value in sources]
            # Looked up by attribute every sync (microseconds; the state dict costs ~20 us per tensor): the lookup
            # sees parameters whose storage moved (offload, reload) as the state dict would.
            self._owners = _owners(hf_model(model), sources)
        self._values: list[torch.Tensor] | None = None
        # Destinations of this rank's pieces, per list of slot views (the sender reuses the same lists every sync).
        self._pieces: dict[int, tuple[Sequence[torch.Tensor], list[Any]]] = {}

    def _sync_values(self) -> list[torch.Tensor]:
        """This sync's values, looked up afresh (sharded parameters as DTensors, buffers as they are)."""
        if self._values is None:
            if self._owners is not None:
                reshard(self._model)
                values = [getattr(module, attr) for module, attr in self._owners]
            else:
                sources = _sources(self._model)
                if [name for name, _ in sources] != [spec.name for spec in self.specs]:
                    raise RuntimeError("the model's weights changed since the sync plan was made; set up a new channel")
                values = [value for _, value in sources]
            self._values = values  # writes run under no_grad: to_local() is then the shard itself, no autograd op
        return self._values

    def write(self, start: int, stop: int, out: Sequence[torch.Tensor] | None, *, local: bool) -> WriteStats:
        if self._gathered is not None:
            return self._gathered.write(start, stop, out, local=local)
        with torch.no_grad():
            values = self._sync_values()[start:stop]
            stats = self._write_local(values, out) if local else self._write_gathered(values, out)
        if stop == len(self.specs):
            self.finish()
        return stats

    def _write_local(self, values: list[torch.Tensor], out: Sequence[torch.Tensor] | None) -> WriteStats:
        if out is None:
            raise RuntimeError("local weight writes need the slot views on every rank")
        cached = self._pieces.get(id(out))
        if cached is None or cached[0] is not out:
            cached = (out, [_local_piece(value, full, self._rank) for value, full in zip(values, out)])
            self._pieces[id(out)] = cached
        dsts, srcs = [], []
        for piece, value in zip(cached[1], values):
            if piece is not None:
                dsts.append(piece[0])
                srcs.append(value.to_local() if isinstance(value, DTensor) else value)
        began = time.perf_counter()
        nbytes = copy_into(dsts, srcs)
        return WriteStats(pack_s=time.perf_counter() - began, bytes=nbytes)

    def _write_gathered(self, values: list[torch.Tensor], out: Sequence[torch.Tensor] | None) -> WriteStats:
        stats = WriteStats()
        for index, value in enumerate(values):
            began = time.perf_counter()
            full = value.full_tensor() if isinstance(value, DTensor) else value
            stats.gather_s += time.perf_counter() - began
            if out is not None:
                began = time.perf_counter()
                stats.bytes += copy_into([out[index]], [full])
                stats.pack_s += time.perf_counter() - began
            del full
        return stats

    def finish(self) -> None:
        self._values = None
        if self._gathered is not None:
            self._gathered.finish()
