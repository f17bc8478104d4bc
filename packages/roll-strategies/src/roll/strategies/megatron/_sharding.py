"""Tensor-parallel split and gather of full megatron tensors (pure torch).

Column-parallel parameters (``linear_qkv``, ``linear_fc1``, embedding and output rows) split along dim 0,
row-parallel ones (``linear_proj``, ``linear_fc2``) along dim 1, norms are replicated. ``linear_fc1`` is
``[gate; up]``: each rank holds ``[gate_shard; up_shard]``, so its halves are split separately. The grouped
``linear_qkv`` layout puts whole query groups on each rank, so a plain dim-0 split is right for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roll.strategies.megatron._mapping import ParamSpec

__all__ = ["gather_tp", "shard_tp"]


def _split(tensor: torch.Tensor, dim: int, tp_rank: int, tp_size: int, name: str) -> torch.Tensor:
    size = tensor.shape[dim]
    if size % tp_size:
        raise ValueError(f"{name}: dimension {dim} has {size} entries, not divisible by tensor parallel size {tp_size}")
    step = size // tp_size
    return tensor.narrow(dim, tp_rank * step, step)


def shard_tp(spec: ParamSpec, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's part of the full tensor of ``spec`` (a view where possible)."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is outside [0, {tp_size})")
    if spec.tp_dim is None or tp_size == 1:
        return full
    if spec.kind == "fc1":
        gate, up = torch.chunk(full, 2, dim=0)
        name = spec.megatron_name
        return torch.cat([_split(gate, 0, tp_rank, tp_size, name), _split(up, 0, tp_rank, tp_size, name)], dim=0)
    return _split(full, spec.tp_dim, tp_rank, tp_size, spec.megatron_name)


def gather_tp(spec: ParamSpec, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every TP rank's shard (in rank order); inverse of :func:`shard_tp`."""
    if spec.tp_dim is None or len(shards) == 1:
        return shards[0]
    if spec.kind == "fc1":
        halves = [torch.chunk(shard, 2, dim=0) for shard in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=spec.tp_dim)
