"""Ulysses sequence parallelism for transformers models: each rank of a group runs a slice of the sequence.

The ranks of one sequence-parallel (SP) group get the same micro-batch. Each holds a contiguous slice of its
sequence (the length is padded to a multiple of the group size) through embeddings, MLPs and norms. Attention needs
the whole sequence, so the registered attention implementation, :data:`ULYSSES_ATTENTION`, exchanges data twice per
layer: an all-to-all turns sequence-sharded query/key/value (every head, a slice of the positions) into
head-sharded ones (a slice of the heads, every position), attention runs on them, and a second all-to-all turns the
output back. Key/value heads fewer than the group are repeated first so every rank has the ones its query heads use.

Masks are built for the whole (padded) sequence before the model call: a (b, 1, T, T) boolean mask for padded rows
(HF passes a 4-D mask through untouched), or the packed ``cu_seq_lens`` for varlen rows. The logits of the slices
are gathered back into the whole sequence; the backward pass of that gather keeps the rank's own slice, because
every rank of the group computes the same loss from the same gathered logits (the gradient is counted once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from roll.strategies.contract import StrategyError
from roll.strategies.varlen import _varlen_sdpa, varlen_kwargs

__all__ = [
    "ULYSSES_ATTENTION",
    "SequenceShard",
    "UlyssesGroup",
    "check_heads",
    "check_same_rows",
    "gather_sequence",
    "new_ulysses_group",
    "register_ulysses_attention",
    "shard_sequence",
]

ULYSSES_ATTENTION = "roll_ulysses_sdpa"
_registered = False
_active: UlyssesGroup | None = None  # the group the attention layers of this process exchange with


@dataclass(frozen=True)
class UlyssesGroup:
    """One SP group: ``size`` consecutive ranks ``[index * size, (index + 1) * size)``; this process is ``rank``."""

    group: Any  # torch.distributed.ProcessGroup
    size: int
    rank: int


def new_ulysses_group(size: int, rank: int, world_size: int) -> UlyssesGroup:
    """Create every SP group of the world (a collective: all ranks call it) and return this rank's."""
    if size < 1 or world_size % size:
        raise StrategyError(
            f"ulysses_size={size} must divide the role's world size {world_size} (data-parallel size = world / "
            f"ulysses_size); choose a divisor of {world_size}"
        )
    mine = None
    for start in range(0, world_size, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return UlyssesGroup(group=mine, size=size, rank=rank % size)


def check_heads(config: Any, size: int) -> None:
    """Attention heads must split evenly over the group: ``num_attention_heads`` divisible by ``ulysses_size``, and
    ``num_key_value_heads`` either divisible by it or dividing it (then each key/value head is repeated)."""
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        raise StrategyError(
            f"ulysses_size={size} needs a model config with num_attention_heads / num_key_value_heads; "
            f"{type(config).__name__} has neither"
        )
    if heads % size:
        raise StrategyError(
            f"the model's num_attention_heads={heads} is not divisible by ulysses_size={size}; Ulysses splits heads "
            f"over the group, so choose a ulysses_size that divides {heads}"
        )
    if kv_heads % size and size % kv_heads:
        raise StrategyError(
            f"the model's num_key_value_heads={kv_heads} and ulysses_size={size} do not divide one another; choose a "
            f"ulysses_size that divides {kv_heads} or is a multiple of it (and divides num_attention_heads={heads})"
        )


def check_same_rows(input_ids: torch.Tensor | None, group: UlyssesGroup) -> None:
    """Fail on every rank of the group unless all got the same rows in the same order (its ranks must share one
    data-parallel shard: dispatch with DP_MP_COMPUTE, and order rows by ``rank_info.dp_rank``, not the rank)."""
    ids = (input_ids if input_ids is not None else torch.zeros(0, 0, dtype=torch.long)).detach().cpu().long()
    weights = torch.arange(ids.numel(), dtype=torch.long) % 65521 + 1  # position-weighted: a reordering changes it
    fingerprint = int((ids.flatten() * weights).sum())  # int64 arithmetic wraps the same way on every rank
    summary = torch.tensor([ids.shape[0], ids.shape[-1], fingerprint], dtype=torch.long)
    both = torch.cat([summary, -summary])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group.group)
    if not torch.equal(both[:3], -both[3:]):
        raise StrategyError(
            f"the {group.size} ranks of a Ulysses group got different rows (or the same rows in another order); "
            "they must receive the same data-parallel shard (dispatch with DP_MP_COMPUTE) and order it alike "
            "(shuffle by rank_info.dp_rank, not by the worker rank)"
        )


def activate(group: UlyssesGroup | None) -> None:
    """Make ``group`` the one :data:`ULYSSES_ATTENTION` exchanges with in this process."""
    global _active
    _active = group


def _all_to_all(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    x = x.contiguous()  # before empty_like, which would copy a transposed view's strides
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group.group)
    return out


class _AllToAll(torch.autograd.Function):
    """Chunk j of dim 0 goes to rank j; chunk j of the result came from rank j. Its own adjoint."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
        ctx.sp = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_to_all(grad, ctx.sp), None


def _seq_to_heads(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """(b, H, S, d) for a slice of positions -> (b, H/sp, sp*S, d) for a slice of the heads."""
    b, heads, s, d = x.shape
    chunks = x.reshape(b, group.size, heads // group.size, s, d).transpose(0, 1)
    got = _AllToAll.apply(chunks, group)  # (sp, b, H/sp, S, d): slot j holds rank j's positions
    return got.permute(1, 2, 0, 3, 4).reshape(b, heads // group.size, group.size * s, d)


def _heads_to_seq(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """(b, sp*S, H/sp, d) for a slice of the heads -> (b, S, H, d) for this rank's slice of positions."""
    b, t, local_heads, d = x.shape
    s = t // group.size
    chunks = x.reshape(b, group.size, s, local_heads, d).transpose(0, 1)
    got = _AllToAll.apply(chunks, group)  # (sp, b, S, H/sp, d): slot j holds head block j
    return got.permute(1, 2, 0, 3, 4).reshape(b, s, group.size * local_heads, d)


def _ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """(b, H, S, d) query and (b, K, S, d) key/value of this rank's positions -> (b, S, H, d) attention output."""
    group = _active
    if group is None:
        raise StrategyError(f"attention implementation {ULYSSES_ATTENTION!r} runs inside a Ulysses strategy only")
    unsupported = [name for name in ("softcap", "s_aux") if kwargs.get(name) is not None]
    if sliding_window is not None:
        unsupported.append("sliding_window")
    if unsupported:
        raise StrategyError(
            f"{ULYSSES_ATTENTION!r} does not implement {', '.join(unsupported)} attention (this model's "
            f"{type(module).__name__} asks for it); set ulysses_size=1"
        )
    if key.shape[1] < group.size:  # too few key/value heads to split: repeat each so every rank gets its own
        repeat = group.size // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    query, key, value = (_seq_to_heads(x, group) for x in (query, key, value))
    if kwargs.get("cu_seq_lens_q") is not None:  # packed rows: every sequence attends itself
        out, _ = _varlen_sdpa(module, query, key, value, None, dropout, scaling, **kwargs)
    else:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            is_causal=attention_mask is None,
            scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1],
        ).transpose(1, 2)
    return _heads_to_seq(out, group), None


def register_ulysses_attention() -> str:
    """Register :data:`ULYSSES_ATTENTION` with transformers (once per process); returns its name for
    ``model.set_attn_implementation``. No mask function is registered: HF then builds no mask of its own and
    passes the whole-sequence 4-D mask the strategy gives it straight through."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ULYSSES_ATTENTION, _ulysses_attention)
        _registered = True
    return ULYSSES_ATTENTION


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _full_mask(segments: torch.Tensor) -> torch.Tensor:
    """(b, 1, T, T) boolean mask: causal within a segment (> 0); padding (0) attends only itself, so no row is empty."""
    length = segments.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    real = (segments != 0)[:, :, None]
    diagonal = torch.eye(length, dtype=torch.bool, device=segments.device)
    return ((causal & same & real) | diagonal)[:, None]


@dataclass(frozen=True)
class SequenceShard:
    """This rank's model inputs, and which logits the ranks compute.

    ``keep``: None when every position's logits are wanted; else this rank's local positions whose logits are (its
    ``logits_to_keep``). ``counts``: how many positions' logits each rank of the group computes, in rank order.
    ``length``: the whole sequence's length before padding to a multiple of the group.
    """

    inputs: dict[str, Any]
    length: int
    counts: list[int]
    keep: torch.Tensor | None = None


def _kept_positions(keep: int | torch.Tensor | None, length: int) -> torch.Tensor | None:
    """Whole-sequence positions whose logits are wanted: the last ``keep`` (int), the given ones (sorted tensor)."""
    if keep is None:
        return None
    if isinstance(keep, int):
        return torch.arange(max(length - keep, 0), length)
    return keep.flatten().cpu()


def shard_sequence(
    inputs: dict[str, torch.Tensor],
    group: UlyssesGroup,
    pad_token_id: int,
    keep: int | torch.Tensor | None = None,
) -> SequenceShard:
    """Whole-sequence model inputs -> this rank's slice, with masks for the whole sequence.

    Packed inputs ((1, N) ``input_ids`` / ``position_ids``, no mask) get a padding segment up to a multiple of the
    group and ``cu_seq_lens`` of the whole sequence. Padded inputs (``attention_mask``, optionally data-packed
    ``segment_ids``) are right-padded and get a (b, 1, T, T) boolean mask. ``keep`` (as HF's ``logits_to_keep``:
    the last k positions, or sorted positions) makes each rank compute the logits of its share of them only.
    """
    ids, positions = inputs["input_ids"], inputs["position_ids"]
    length = ids.shape[-1]
    extra = _round_up(length, group.size) - length
    out: dict[str, Any] = {}
    if "attention_mask" not in inputs:  # packed: one row, positions restart per sequence
        if extra:
            ids = F.pad(ids, (0, extra), value=pad_token_id)
            tail = torch.arange(extra, dtype=positions.dtype, device=positions.device)
            positions = torch.cat([positions, tail.expand(positions.shape[0], extra)], dim=-1)
        out.update(varlen_kwargs(positions))
    else:
        segments = inputs.get("segment_ids")
        segments = (inputs["attention_mask"] != 0).long() if segments is None else segments
        ids = F.pad(ids, (0, extra), value=pad_token_id)
        positions = F.pad(positions, (0, extra))
        out["attention_mask"] = _full_mask(F.pad(segments, (0, extra)))
    step = ids.shape[-1] // group.size
    start = group.rank * step
    out["input_ids"] = ids[..., start : start + step]
    out["position_ids"] = positions[..., start : start + step]
    kept = _kept_positions(keep, length)
    if kept is None:
        return SequenceShard(out, length, [step] * group.size)
    owner = torch.div(kept, step, rounding_mode="floor")
    counts = [int((owner == rank).sum()) for rank in range(group.size)]
    local = (kept[owner == group.rank] - start).to(ids.device)
    return SequenceShard(out, length, counts, local)


class _GatherSequence(torch.autograd.Function):
    """Concatenate every rank's (b, counts[j], ...) part along dim 1; the gradient keeps this rank's part (each rank
    computes the same loss from the gathered tensor, so the loss's gradient must count once)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: UlyssesGroup, counts: list[int]) -> torch.Tensor:
        ctx.start = sum(counts[: group.rank])
        ctx.count = counts[group.rank]
        most = max(counts)
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, most - x.shape[1])).contiguous()  # equal shapes for all_gather
        parts = [torch.empty_like(x) for _ in range(group.size)]
        dist.all_gather(parts, x, group=group.group)
        return torch.cat([part[:, :count] for part, count in zip(parts, counts, strict=True)], dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad[:, ctx.start : ctx.start + ctx.count].contiguous(), None, None


def gather_sequence(x: torch.Tensor, group: UlyssesGroup, counts: list[int]) -> torch.Tensor:
    """Every rank's part of the sequence (b, counts[rank], ...) -> all of them in rank order (b, sum(counts), ...)."""
    return _GatherSequence.apply(x, group, counts)
