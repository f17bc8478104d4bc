"""Agentic samples in the layout of RLVR rollouts, so the same training code consumes both.

Per row (see :mod:`roll.strategies.base`): ``prompts`` (left-padded), ``responses`` (right-padded),
``input_ids = prompts + responses``, ``attention_mask``, ``position_ids``, ``response_mask`` and
``rollout_log_probs`` over the response columns, and ``scores`` (float32, one per row).

A trajectory-wise row's response holds every assistant turn *and* the environment's tokens between them:
``attention_mask`` is 1 on all of them, ``response_mask`` (the loss mask) only on assistant tokens, and
``rollout_log_probs`` is 0 elsewhere. A response always ends with an assistant token, so the last valid
``response_mask`` position is the row's last token (where a response-level score is placed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies.ops import position_ids_from_attention_mask

__all__ = ["LAYOUT_KEYS", "SampleRow", "concat_samples", "rows_to_batch"]

LAYOUT_KEYS = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "rollout_log_probs",
    "scores",
)


@dataclass
class SampleRow:
    """One sample before padding."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    """1 on tokens the policy generated (trained on), 0 on environment/template tokens."""
    log_probs: list[float]
    score: float

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.log_probs) != n:
            raise ConfigError(
                f"sample row: response_ids ({n}), response_mask ({len(self.response_mask)}) and log_probs "
                f"({len(self.log_probs)}) must have equal lengths"
            )
        if not any(self.response_mask):
            raise ConfigError("sample row has no generated token; every sample needs at least one")


def _tensors(rows: Sequence[SampleRow], pad_token_id: int) -> dict[str, torch.Tensor]:
    n, width_p, width_r = len(rows), max(len(r.prompt_ids) for r in rows), max(len(r.response_ids) for r in rows)
    prompts = torch.full((n, width_p), pad_token_id, dtype=torch.long)
    responses = torch.full((n, width_r), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width_p + width_r), dtype=torch.long)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    log_probs = torch.zeros((n, width_r), dtype=torch.float32)
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        if p:
            prompts[i, width_p - p :] = torch.tensor(row.prompt_ids, dtype=torch.long)
            attention[i, width_p - p : width_p] = 1
        responses[i, :r] = torch.tensor(row.response_ids, dtype=torch.long)
        attention[i, width_p : width_p + r] = 1
        response_mask[i, :r] = torch.tensor(row.response_mask, dtype=torch.long)
        log_probs[i, :r] = torch.tensor(row.log_probs, dtype=torch.float32)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": position_ids_from_attention_mask(attention),
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
        "scores": torch.tensor([row.score for row in rows], dtype=torch.float32),
    }


def rows_to_batch(
    rows: Sequence[SampleRow], columns: dict[str, list[Any]], pad_token_id: int, meta_info: dict | None = None
) -> DataProto:
    """A padded DataProto of ``rows`` with per-row non-tensor ``columns`` (each a list of ``len(rows)`` values)."""
    if not rows:
        raise ConfigError("rows_to_batch needs at least one row")
    for key, values in columns.items():
        if len(values) != len(rows):
            raise ConfigError(f"column {key!r} has {len(values)} values for {len(rows)} rows")
    return DataProto.from_dict(_tensors(rows, pad_token_id), columns, meta_info=meta_info or {})


def _repad(batch: DataProto, width_p: int, width_r: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    data = batch.batch
    p, r = data["prompts"].shape[1], data["responses"].shape[1]
    lead, tail = width_p - p, width_r - r

    def pad(t: torch.Tensor, left: int, right: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (left, right), value=value) if left or right else t

    prompts = pad(data["prompts"], lead, 0, pad_token_id)
    responses = pad(data["responses"], 0, tail, pad_token_id)
    attention = torch.cat(
        [pad(data["attention_mask"][:, :p], lead, 0, 0), pad(data["attention_mask"][:, p:], 0, tail, 0)], dim=1
    )
    out: dict[str, Any] = {key: data[key] for key in data.keys() if isinstance(key, str) and key not in LAYOUT_KEYS}
    out.update(
        prompts=prompts,
        responses=responses,
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attention,
        position_ids=position_ids_from_attention_mask(attention),
        response_mask=pad(data["response_mask"], 0, tail, 0),
        rollout_log_probs=pad(data["rollout_log_probs"], 0, tail, 0.0),
        scores=data["scores"],
    )
    return out


def concat_samples(batches: Sequence[DataProto], pad_token_id: int) -> DataProto:
    """Concatenate sample batches of different widths: prompts re-padded on the left, responses on the right.

    Every batch must have the same keys. ``meta_info["metrics"]`` is merged as :meth:`DataProto.concat` does.
    """
    batches = [b for b in batches if b is not None]
    if not batches:
        raise ConfigError("concat_samples needs at least one batch")
    width_p = max(b.batch["prompts"].shape[1] for b in batches)
    width_r = max(b.batch["responses"].shape[1] for b in batches)
    # Non-tensor columns are passed on as they are stored (Arrow), not converted through numpy.
    padded = [DataProto(_repad(b, width_p, width_r, pad_token_id), b.non_tensor_batch, b.meta_info) for b in batches]
    return DataProto.concat(padded)
