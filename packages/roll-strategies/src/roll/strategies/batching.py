"""Micro-batches by token budget and padding-free (packed) model inputs, with logits mapped back onto the rows.

Two independent levers, both exact (the functions a Worker passes see the same logits at every real position):

* **Token-budget micro-batches** (``max_tokens``): rows are grouped by length so that each micro-batch's token count
  stays under the budget, instead of a fixed number of rows per micro-batch. Padded micro-batches drop the columns
  that are padding in all their rows (rounded up to ``round_to``), so a few long rows no longer make every
  micro-batch as wide as the longest. Losses stay exact because they divide by the mini-batch's global counts
  (:class:`~roll.strategies.contract.LossScale`), whatever the grouping.
* **Packing** (``packing``): a micro-batch's rows are concatenated without their padding into one sequence of shape
  (1, N) whose ``position_ids`` restart at 0 for every row. transformers reads that layout as separate sequences
  when no attention mask is given: a block-diagonal causal mask for ``sdpa`` / ``eager`` / ``flex_attention``,
  ``cu_seqlens`` (varlen kernels, no mask at all) for ``flash_attention_2`` / ``_3``.

Either way :meth:`MicroLayout.restore` hands ``forward_func`` / ``loss_func`` logits in the layout of the rows as
given, (b, T, V) or (b, k, V) with ``logits_to_keep=k``; positions the model did not compute (padding) hold 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from roll.protocol import DataProto
from roll.strategies.contract import StrategyError
from roll.strategies.ops import position_ids_from_attention_mask

if TYPE_CHECKING:
    from roll.strategies.config import StrategyWorkerConfig

__all__ = [
    "MicroBatchPlan",
    "MicroLayout",
    "PaddingStats",
    "infer_plan",
    "model_layout",
    "packed_layout",
    "padded_layout",
    "plan_micro_batches",
    "restore_row_order",
    "row_lengths",
    "split_micro_batches",
    "train_plan",
]


@dataclass(frozen=True)
class MicroBatchPlan:
    """How one call splits its rows and lays them out.

    ``rows``: rows per micro-batch when ``max_tokens`` is None (fixed-size micro-batches in the batch's order).
    ``max_tokens``: token budget per micro-batch; a row longer than the budget runs alone. ``round_to``: widths
    (padded) or packed lengths are rounded up to a multiple of it. ``packing``: padding-free packed rows.
    """

    rows: int
    max_tokens: int | None = None
    round_to: int = 1
    packing: bool = False

    def __post_init__(self) -> None:
        if self.rows < 1 or self.round_to < 1 or (self.max_tokens is not None and self.max_tokens < 1):
            raise StrategyError(f"invalid micro-batch plan {self}: rows, round_to and max_tokens must be >= 1")


def train_plan(config: StrategyWorkerConfig) -> MicroBatchPlan:
    """The training micro-batches a role's settings ask for (``batching`` and per_device_train_batch_size)."""
    b = config.batching
    return MicroBatchPlan(
        rows=config.training_args.per_device_train_batch_size,
        max_tokens=b.max_tokens_per_microbatch_in_train if b.dynamic_batching_in_train else None,
        round_to=b.sequence_length_round_in_train,
        packing=b.sequence_packing,
    )


def infer_plan(config: StrategyWorkerConfig) -> MicroBatchPlan:
    """The forward micro-batches a role's settings ask for (``batching`` and infer_batch_size)."""
    b = config.batching
    return MicroBatchPlan(
        rows=config.infer_batch_size,
        max_tokens=b.max_tokens_per_microbatch_in_infer if b.dynamic_batching_in_infer else None,
        round_to=b.sequence_length_round_in_infer,
        packing=b.sequence_packing,
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def row_lengths(batch: DataProto) -> list[int]:
    """Real tokens of each row (non-zero ``attention_mask``; the full width when the batch has no mask)."""
    ids = batch.batch["input_ids"]
    if "attention_mask" not in batch.batch.keys():
        return [ids.shape[1]] * ids.shape[0]
    return [int(n) for n in (batch.batch["attention_mask"] != 0).sum(dim=1).tolist()]


def plan_micro_batches(lengths: Sequence[int], plan: MicroBatchPlan) -> list[list[int]]:
    """Row indices of each micro-batch.

    Fixed size: consecutive chunks of ``plan.rows``. Token budget: padded micro-batches cost rows x the rounded
    longest row and are filled in order of decreasing length (similar lengths together); packed ones cost their
    rounded total length and are filled first-fit-decreasing (fewest micro-batches).
    """
    count = len(lengths)
    if plan.max_tokens is None:
        return [list(range(start, min(start + plan.rows, count))) for start in range(0, count, plan.rows)]
    order = sorted(range(count), key=lambda i: (-lengths[i], i))
    if plan.packing:
        return _first_fit(order, lengths, plan)
    groups: list[list[int]] = []
    width = 0
    for index in order:
        row_width = _round_up(max(lengths[index], 1), plan.round_to)
        if groups and (len(groups[-1]) + 1) * max(width, row_width) <= plan.max_tokens:
            groups[-1].append(index)
            width = max(width, row_width)
        else:
            groups.append([index])
            width = row_width
    return groups


def _first_fit(order: list[int], lengths: Sequence[int], plan: MicroBatchPlan) -> list[list[int]]:
    budget = plan.max_tokens or 0
    groups: list[list[int]] = []
    totals: list[int] = []
    for index in order:
        size = max(lengths[index], 1)
        for slot, total in enumerate(totals):
            if _round_up(total + size, plan.round_to) <= budget:
                groups[slot].append(index)
                totals[slot] += size
                break
        else:
            groups.append([index])
            totals.append(size)
    return [sorted(group) for group in groups]


@dataclass
class PaddingStats:
    """Tokens a call's model forwards processed: ``real`` ones and the ``computed`` total (padding included)."""

    real: int = 0
    computed: int = 0

    @property
    def padded_fraction(self) -> float:
        return 1.0 - self.real / self.computed if self.computed else 0.0


@dataclass
class MicroLayout:
    """One micro-batch as the model gets it, and how its logits map back onto the rows as given.

    ``inputs``: ``input_ids`` and ``position_ids`` (and ``attention_mask`` when padded). ``keep``: what to pass as
    ``logits_to_keep`` (an int: the last positions; a 1-D tensor: packed positions), None for every position.
    """

    inputs: dict[str, torch.Tensor]
    keep: int | torch.Tensor | None
    rows: int  # b
    width: int  # columns of the restored logits (T, or k with logits_to_keep=k)
    real_tokens: int
    # padded: the restored logits are the model's, zero-padded by (before, after) columns
    pad_before: int = 0
    pad_after: int = 0
    trimmed: bool = False  # padded: the model saw a window of the columns, so logits need placing
    dummy: bool = False  # trimmed: no wanted position holds a real token; one position ran, all logits are 0
    # packed: scatter computed position j to (row_index[j], col_index[j])
    row_index: torch.Tensor | None = None
    col_index: torch.Tensor | None = None
    placed: int | None = field(default=None)  # packed: how many computed positions are placed (the rest are dummies)

    @property
    def computed_tokens(self) -> int:
        ids = self.inputs["input_ids"]
        return int(ids.shape[0] * ids.shape[1])

    def restore(self, logits: torch.Tensor, keeps_logits: bool = True) -> torch.Tensor:
        """The model's logits -> (b, width, V) aligned with the rows as given; 0 where nothing was computed.

        ``keeps_logits=False``: the model ignored ``keep`` and returned every position, so select them here.
        """
        if self.row_index is None:  # padded
            if not self.trimmed:
                return logits
            if not keeps_logits and isinstance(self.keep, int):
                logits = logits[:, -self.keep :]
            if self.dummy:
                logits = logits[:, :0]
            if self.pad_before or self.pad_after:
                logits = F.pad(logits, (0, 0, self.pad_before, self.pad_after))
            return logits
        assert self.col_index is not None
        flat = logits[0]
        if not keeps_logits and isinstance(self.keep, torch.Tensor):
            flat = flat.index_select(0, self.keep.to(flat.device))
        flat = flat[: self.placed]
        out = flat.new_zeros(self.rows, self.width, flat.shape[-1])
        index = (self.row_index.to(flat.device), self.col_index.to(flat.device))
        return out.index_put(index, flat)


def _positions(batch: DataProto, mask: torch.Tensor) -> torch.Tensor:
    keys = batch.batch.keys()
    return batch.batch["position_ids"] if "position_ids" in keys else position_ids_from_attention_mask(mask)


def padded_layout(batch: DataProto, keep: int | None, *, trim: bool, round_to: int = 1) -> MicroLayout:
    """Rows as given; with ``trim`` only the columns [lo, hi) holding real tokens (width rounded up to ``round_to``)."""
    ids = batch.batch["input_ids"]
    keys = batch.batch.keys()
    mask = batch.batch["attention_mask"] if "attention_mask" in keys else torch.ones_like(ids)
    positions = _positions(batch, mask)
    rows, length = ids.shape
    width = min(keep, length) if keep else length
    real = int((mask != 0).sum())
    if not trim:
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        if "segment_ids" in keys:
            inputs["segment_ids"] = batch.batch["segment_ids"]
        return MicroLayout(inputs, keep, rows, width, real)
    used = (mask != 0).any(dim=0).nonzero().flatten()
    lo, hi = (int(used[0]), int(used[-1]) + 1) if len(used) else (length - 1, length)
    span = min(length, _round_up(hi - lo, round_to))
    lo = min(lo, length - span)
    hi = lo + span
    first_kept = max(lo, length - width)  # first column of the window whose logits are wanted
    needed = max(hi - first_kept, 1)
    inputs = {"input_ids": ids[:, lo:hi], "attention_mask": mask[:, lo:hi], "position_ids": positions[..., lo:hi]}
    if "segment_ids" in keys:
        inputs["segment_ids"] = batch.batch["segment_ids"][:, lo:hi]
    if hi <= first_kept:  # no wanted column holds a real token: one position runs, its logits are dropped
        return MicroLayout(inputs, needed, rows, width, real, pad_after=width, trimmed=True, dummy=True)
    before = first_kept - (length - width)
    return MicroLayout(inputs, needed, rows, width, real, pad_before=before, pad_after=length - hi, trimmed=True)


def packed_layout(batch: DataProto, keep: int | None, *, round_to: int = 1, pad_token_id: int = 0) -> MicroLayout:
    """The rows' real tokens concatenated into (1, N), positions restarting at 0 per row (per segment when the
    batch has ``segment_ids``); N rounded up to ``round_to`` with a padding segment."""
    ids = batch.batch["input_ids"]
    keys = batch.batch.keys()
    mask = (batch.batch["attention_mask"] if "attention_mask" in keys else torch.ones_like(ids)) != 0
    rows, length = ids.shape
    width = min(keep, length) if keep else length
    row_of, col_of = mask.nonzero(as_tuple=True)  # row-major: row by row, left to right
    total = len(row_of)
    device = ids.device
    starts = torch.ones(total, dtype=torch.bool, device=device)
    starts[1:] = row_of[1:] != row_of[:-1]
    if "segment_ids" in keys:
        segments = batch.batch["segment_ids"][row_of, col_of]
        starts[1:] |= segments[1:] != segments[:-1]
    arange = torch.arange(total, device=device)
    expected = arange - torch.cummax(torch.where(starts, arange, torch.zeros_like(arange)), dim=0).values
    given = _positions(batch, mask.long())
    if given.dim() != 2:
        raise StrategyError(
            f"sequence packing needs 2-D position_ids (batch, length), got shape {tuple(given.shape)}; "
            "turn sequence_packing off for this model"
        )
    if not torch.equal(given[row_of, col_of].long(), expected):
        raise StrategyError(
            "sequence packing needs position_ids that count 0, 1, 2, ... over each row's real tokens (restarting "
            "at every segment); this batch's do not, so packing would change the model's outputs. Turn "
            "sequence_packing off or give standard position_ids"
        )
    packed_ids, positions = ids[row_of, col_of], expected
    padded_total = _round_up(max(total, 1), round_to)
    if padded_total > total:  # a padding segment of its own
        extra = padded_total - total
        packed_ids = torch.cat([packed_ids, torch.full((extra,), pad_token_id, dtype=ids.dtype, device=device)])
        positions = torch.cat([positions, torch.arange(extra, device=device)])
    wanted = (col_of >= length - width).nonzero().flatten()
    placed = len(wanted)
    keep_index = wanted if placed else torch.tensor([padded_total - 1], device=device)
    inputs = {"input_ids": packed_ids.unsqueeze(0), "position_ids": positions.unsqueeze(0)}
    return MicroLayout(
        inputs,
        keep_index,
        rows,
        width,
        total,
        row_index=row_of[wanted],
        col_index=col_of[wanted] - (length - width),
        placed=placed,
    )


def model_layout(
    batch: DataProto, keep: int | None, plan: MicroBatchPlan, *, pad_token_id: int = 0, padded_mask: bool = True
) -> MicroLayout:
    """The layout a plan asks for: packed, trimmed padded (token budget) or the rows as given."""
    if "input_ids" not in batch.batch.keys():
        raise StrategyError(f"model inputs need an 'input_ids' tensor; the batch has {batch.keys()}")
    if plan.packing:
        return packed_layout(batch, keep, round_to=plan.round_to, pad_token_id=pad_token_id)
    return padded_layout(batch, keep, trim=plan.max_tokens is not None, round_to=plan.round_to)


def split_micro_batches(batch: DataProto, plan: MicroBatchPlan) -> tuple[list[DataProto], torch.Tensor | None]:
    """The micro-batches of ``batch`` and, when they reorder rows, the row order they were taken in."""
    if not len(batch):
        return [], None
    if plan.max_tokens is None:
        return batch.split(plan.rows), None
    groups = plan_micro_batches(row_lengths(batch), plan)
    order = torch.tensor([index for group in groups for index in group], dtype=torch.long)
    return [batch.select_idxs(torch.tensor(group, dtype=torch.long)) for group in groups], order


def restore_row_order(outputs: dict[str, torch.Tensor], order: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Outputs gathered micro-batch by micro-batch -> the batch's own row order."""
    if order is None:
        return outputs
    inverse = torch.argsort(order)
    return {key: value.index_select(0, inverse.to(value.device)) for key, value in outputs.items()}
