"""Turning roll's padded batches into Megatron inputs and Megatron outputs back into roll logits (pure torch).

Megatron's GPT applies RoPE by sequence position and a causal mask, without per-row position ids or padding
masks. roll's rows are ``[left padding][prompt][response][right padding]``, so each row is rolled left until
its first real token sits at position 0: then positions are right and right padding is invisible to real
tokens under the causal mask. Logits are rolled back afterwards, so ``forward_func`` / ``loss_func`` see the
batch exactly as given.

Sequences are padded to a multiple of what the parallel layout needs (``tp`` with sequence parallelism,
``2 * cp`` with context parallelism). With context parallelism each rank gets two of ``2 * cp`` chunks in
"zigzag" order (``r`` and ``2cp - 1 - r``), which balances the causal-attention work across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies.contract import StrategyError

if TYPE_CHECKING:
    from roll.strategies.batching import MicroLayout
    from roll.strategies.config import BatchingArgs
    from roll.strategies.megatron.config import MegatronConfig

__all__ = [
    "GatherContextParallel",
    "PreparedInputs",
    "check_batching",
    "count_loss_tokens",
    "left_shifts",
    "loss_scale",
    "pad_micro_batches",
    "prepare_inputs",
    "restore_logits",
    "roll_rows",
    "sequence_multiple",
    "zigzag_merge",
    "zigzag_split",
]


def left_shifts(attention_mask: torch.Tensor) -> torch.Tensor:
    """Leading padding of each row (0 for rows without real tokens), as int64 of shape (B,)."""
    mask = attention_mask.bool()
    first = mask.long().argmax(dim=1)
    return torch.where(mask.any(dim=1), first, torch.zeros_like(first))


def roll_rows(tensor: torch.Tensor, shifts: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Roll each row of ``tensor`` (B, T, ...) left by ``shifts[b]`` positions (right if ``inverse``)."""
    length = tensor.shape[1]
    positions = torch.arange(length, device=tensor.device).unsqueeze(0)
    offsets = shifts.to(tensor.device).unsqueeze(1)
    index = (positions - offsets if inverse else positions + offsets) % length
    index = index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand_as(tensor)
    return torch.gather(tensor, 1, index)


def sequence_multiple(tp_size: int, sequence_parallel: bool, cp_size: int) -> int:
    """The sequence length must be a multiple of this for the parallel layout."""
    return (tp_size if sequence_parallel else 1) * (2 * cp_size if cp_size > 1 else 1)


def zigzag_split(tensor: torch.Tensor, cp_rank: int, cp_size: int, dim: int = 1) -> torch.Tensor:
    """This context-parallel rank's two chunks (``cp_rank`` and ``2cp-1-cp_rank`` of ``2cp``) along ``dim``."""
    if cp_size == 1:
        return tensor
    chunks = torch.chunk(tensor, 2 * cp_size, dim=dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]], dim=dim)


def zigzag_merge(per_rank: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`zigzag_split`, from every rank's part in rank order."""
    cp_size = len(per_rank)
    if cp_size == 1:
        return per_rank[0]
    chunks: list[torch.Tensor | None] = [None] * (2 * cp_size)
    for rank, part in enumerate(per_rank):
        first, second = torch.chunk(part, 2, dim=dim)
        chunks[rank], chunks[2 * cp_size - 1 - rank] = first, second
    return torch.cat(chunks, dim=dim)  # type: ignore[arg-type]


@dataclass
class PreparedInputs:
    """One micro-batch as Megatron consumes it, plus what is needed to map logits back."""

    input_ids: torch.Tensor  # (b, local padded length): rolled, padded, this CP rank's chunks
    position_ids: torch.Tensor
    shifts: torch.Tensor  # (b,)
    length: int  # T of the original batch
    padded_length: int  # T after padding to the layout's multiple
    layout: MicroLayout | None = None  # token-budget window or packed rows: how logits map back onto the rows
    packed_seq_params: Any = None  # megatron's PackedSeqParams (THD) for packed rows


def prepare_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    multiple: int = 1,
    cp_rank: int = 0,
    cp_size: int = 1,
    pad_token_id: int = 0,
) -> PreparedInputs:
    """Roll each row so its first real token is at position 0, pad to ``multiple``, take this CP rank's chunks."""
    shifts = left_shifts(attention_mask)
    rolled_mask = roll_rows(attention_mask.long(), shifts)
    lengths = rolled_mask.sum(dim=1, keepdim=True)
    prefix = torch.arange(rolled_mask.shape[1], device=rolled_mask.device).unsqueeze(0) < lengths
    if not torch.equal(rolled_mask.bool(), prefix):
        raise StrategyError(
            "the megatron backend needs each row's attention_mask to be one contiguous block of ones "
            "(left-padded prompt + right-padded response); a row has padding between real tokens"
        )
    ids = roll_rows(input_ids, shifts)
    length = ids.shape[1]
    padded = -(-length // multiple) * multiple
    if padded != length:
        ids = torch.nn.functional.pad(ids, (0, padded - length), value=pad_token_id)
    positions = torch.arange(padded, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
    return PreparedInputs(
        input_ids=zigzag_split(ids, cp_rank, cp_size),
        position_ids=zigzag_split(positions, cp_rank, cp_size).contiguous(),
        shifts=shifts,
        length=length,
        padded_length=padded,
    )


def restore_logits(logits: torch.Tensor, prepared: PreparedInputs, vocab_size: int) -> torch.Tensor:
    """Full-sequence logits (b, padded T, padded V) -> float32 (b, T, vocab_size) aligned with the input rows."""
    logits = logits[:, : prepared.length, :vocab_size].float()
    return roll_rows(logits, prepared.shifts, inverse=True)


class GatherContextParallel(torch.autograd.Function):
    """All-gather each CP rank's zigzag chunks into the full sequence; backward keeps only the local chunks.

    Every CP rank then computes the same loss over the full sequence, and each rank's gradient is that loss's
    gradient with respect to its own chunks: summed over CP ranks (Megatron's gradient reduce) it is exact.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, local: torch.Tensor, group: dist.ProcessGroup):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.size, ctx.rank = size, rank  # type: ignore[attr-defined]
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return zigzag_merge(parts)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):
        return zigzag_split(grad, ctx.rank, ctx.size).contiguous(), None  # type: ignore[attr-defined]


def check_batching(batching: BatchingArgs, config: MegatronConfig) -> None:
    """Token-budget micro-batches and packing need what the megatron backend can give them (or a ConfigError)."""
    dynamic = batching.dynamic_batching_in_train or batching.dynamic_batching_in_infer
    if (dynamic or batching.sequence_packing) and config.pipeline_model_parallel_size > 1:
        raise ConfigError(
            "batching.dynamic_batching_in_* and batching.sequence_packing need pipeline_model_parallel_size=1 on "
            "the megatron backend (pipeline stages exchange fixed-shape activations); turn them off or use PP=1"
        )
    if batching.sequence_packing and config.context_parallel_size > 1:
        raise ConfigError(
            "batching.sequence_packing with context_parallel_size > 1 is not supported by roll's megatron backend; "
            "set context_parallel_size=1 or sequence_packing=false"
        )
    if batching.sequence_packing and config.transformer_impl != "transformer_engine":
        raise ConfigError(
            "batching.sequence_packing on the megatron backend runs THD (varlen) attention, which needs "
            "strategy_config.transformer_impl='transformer_engine'; set it or turn sequence_packing off"
        )


def count_loss_tokens(batch: DataProto, key: str | None) -> int:
    """Tokens the loss is normalized by: non-zeros of ``batch[key]``, or rows if ``key`` is None."""
    if key is None:
        return len(batch)
    if batch.batch is None or key not in batch.batch.keys():
        raise StrategyError(f"loss_mask_key={key!r} is not a tensor of the batch ({batch.keys()})")
    return int((batch.batch[key] != 0).sum())


def loss_scale(dp_size: int, num_micro_batches: int) -> float:
    """Factor on each micro-batch's loss so Megatron's gradient averaging yields the contract's plain sum.

    Megatron divides each micro-batch loss by the number of micro-batches (and multiplies by the CP size,
    which its 1/(dp*cp) gradient average cancels); roll's losses are already shares of the mini-batch loss.
    """
    return float(dp_size * num_micro_batches)


def pad_micro_batches(batch: DataProto, size: int) -> list[tuple[DataProto, int]]:
    """Micro-batches of exactly ``size`` rows (the last one padded by repeating its final row), with real rows.

    Pipeline schedules exchange fixed-shape activations, so every micro-batch must have the same shape; the
    padded rows' outputs are dropped by the caller.
    """
    micros = batch.split(size) if len(batch) else []
    out = []
    for micro in micros:
        real = len(micro)
        if real < size:
            filler = micro.select_idxs(torch.full((size - real,), real - 1, dtype=torch.long))
            micro = DataProto.concat([micro, filler])
        out.append((micro, real))
    return out
