"""Sequence packing for SFT: several examples per row, with no attention across examples.

A packed row carries ``position_ids`` that restart at 0 for every example and ``segment_ids`` (1, 2, ... per
example, 0 for padding). Two ways to run a packed batch so that each example's logits equal running it alone
(both checked against transformers' Qwen2 with sdpa and eager attention on CPU):

* pass ``attention_mask=packed_attention_mask(segment_ids, dtype)``, a 4-D additive block-diagonal causal
  mask, together with ``position_ids``; works with any cache setting and with eager and sdpa attention;
* pass only ``position_ids`` (no ``attention_mask``) with ``use_cache=False``: transformers then derives the
  same block-diagonal mask from where the positions restart (flash-attention uses them as sequence bounds).

A plain 2-D ``attention_mask`` would let later examples attend to earlier ones in the same row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.pipelines.data.encoding import IGNORE_INDEX
from roll.pipelines.data.errors import DataError
from roll.strategies import ops

__all__ = ["pack_sft_examples", "packed_attention_mask"]


def pack_sft_examples(examples: Sequence[Mapping[str, Any]], max_length: int) -> list[dict[str, list[int]]]:
    """Pack SFT examples (``input_ids``, ``labels``) into rows of at most ``max_length`` tokens.

    First-fit decreasing: examples are taken longest first (ties keep input order) and each goes into the first
    row with room, so the result is deterministic. Every returned row has ``input_ids``, ``labels``,
    ``position_ids`` (restarting at 0 per example), ``segment_ids`` (1-based example number within the row) and
    ``example_indices`` (positions in ``examples``). Each example's first label is set to ``-100``: at a
    segment start the previous token belongs to another example and must not predict it.

    Raises:
        DataError: an example is longer than ``max_length``.
    """
    if max_length < 1:
        raise DataError(f"max_length must be positive to pack examples, got {max_length}")
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]["input_ids"]))
    rows: list[dict[str, list[int]]] = []
    for index in order:
        example = examples[index]
        length = len(example["input_ids"])
        if length > max_length:
            raise DataError(
                f"example {index} has {length} tokens, more than max_length={max_length}; drop long examples with "
                f"filter_by_length first or raise max_length"
            )
        row = next((r for r in rows if len(r["input_ids"]) + length <= max_length), None)
        if row is None:
            row = {"input_ids": [], "labels": [], "position_ids": [], "segment_ids": [], "example_indices": []}
            rows.append(row)
        segment = len(row["example_indices"]) + 1
        labels = list(example["labels"])
        if labels:
            labels[0] = IGNORE_INDEX
        row["input_ids"].extend(example["input_ids"])
        row["labels"].extend(labels)
        row["position_ids"].extend(range(length))
        row["segment_ids"].extend([segment] * length)
        row["example_indices"].append(index)
    return rows


def packed_attention_mask(segment_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (B, 1, T, T) additive mask of packed rows (see :func:`roll.strategies.ops.packed_attention_mask`)."""
    if segment_ids.dim() != 2:
        raise DataError(f"segment_ids must be (batch, length), got shape {tuple(segment_ids.shape)}")
    return ops.packed_attention_mask(segment_ids, dtype)
