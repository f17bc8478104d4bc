"""ROLL's train-vs-infer mismatch filters (``train_infer_correction.filters``): tokens or whole responses whose
training-side log-probs disagree too much with the rollout engine's are left out of the loss.

With ``d = old_logp - infer_logp`` per token (0 off the mask), the statistics at each aggregation level are:

* ``token``: ratio ``exp(d)``, diff ``exp(old_logp) - exp(infer_logp)``;
* ``geometric``: ``exp(mean_t d)`` and ``mean_t diff`` over the response's valid tokens, on every token;
* ``sequence``: ``exp(sum_t d)`` and ``sum_t diff``, on every token;
* ``segment``: like geometric, per maximal run of valid tokens (one assistant turn of a multi-turn row).

A filter keeps the tokens with ``ratio_low <= ratio <= ratio_high`` (when ``ratio_enabled``) and
``diff_low <= diff <= diff_high`` (when ``diff_enabled``); filters multiply. Pass rates are reported per filter
(over the valid tokens), with the final one and the tokens/responses removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from roll.pipelines.algorithms._validation import as_bool_mask, check_choice, check_same_shape
from roll.pipelines.algorithms.agentic import segment_masked_mean
from roll.runtime.errors import ConfigError

__all__ = ["AGG_TYPES", "RatioDiffFilter", "train_infer_filter_mask"]

AGG_TYPES = ("token", "geometric", "sequence", "segment")
AggType = Literal["token", "geometric", "sequence", "segment"]


@dataclass(frozen=True)
class RatioDiffFilter:
    """One of ROLL's filter rules, with ROLL's defaults (a disabled rule is simply not passed)."""

    agg_type: AggType = "token"
    ratio_enabled: bool = True
    ratio_low: float = 0.8
    ratio_high: float = 1.2
    diff_enabled: bool = False
    diff_low: float = -0.2
    diff_high: float = 0.2

    def __post_init__(self) -> None:
        check_choice("agg_type", self.agg_type, AGG_TYPES)
        if self.ratio_low > self.ratio_high or self.diff_low > self.diff_high:
            raise ConfigError(
                f"train_infer_correction filter bounds are inverted: ratio [{self.ratio_low}, {self.ratio_high}], "
                f"diff [{self.diff_low}, {self.diff_high}]; give low <= high"
            )


def _stats(agg: str, log_ratio: torch.Tensor, diff: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(ratio, diff) at one aggregation level, (batch, len)."""
    if agg == "token":
        return log_ratio.exp(), diff
    if agg == "segment":
        return segment_masked_mean(log_ratio, valid).exp(), segment_masked_mean(diff, valid)
    tokens = valid.sum(-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    ratio_sum, diff_sum = log_ratio.sum(-1, keepdim=True), diff.sum(-1, keepdim=True)
    if agg == "geometric":
        ratio_sum, diff_sum = ratio_sum / tokens, diff_sum / tokens
    return ratio_sum.exp().expand_as(log_ratio), diff_sum.expand_as(diff)


@torch.no_grad()
def train_infer_filter_mask(
    old_log_probs: torch.Tensor,
    infer_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    filters: Sequence[RatioDiffFilter],
) -> tuple[torch.Tensor, dict[str, float]]:
    """((batch, len) float mask of the tokens every filter keeps (1 off ``response_mask`` too), metrics)."""
    check_same_shape("old_log_probs", old_log_probs, infer_log_probs=infer_log_probs, response_mask=response_mask)
    valid = as_bool_mask(response_mask)
    zero = old_log_probs.new_zeros((), dtype=torch.float64)
    old = torch.where(valid, old_log_probs.double(), zero)
    infer = torch.where(valid, infer_log_probs.double(), zero)
    log_ratio = old - infer
    diff = torch.where(valid, old.exp() - infer.exp(), zero)
    keep = torch.ones_like(log_ratio)
    tokens = max(float(valid.sum()), 1.0)
    metrics: dict[str, float] = {}
    for rule in filters:
        ratio, delta = _stats(rule.agg_type, log_ratio, diff, valid)
        for kind, enabled, value, low, high in (
            ("ratio", rule.ratio_enabled, ratio, rule.ratio_low, rule.ratio_high),
            ("diff", rule.diff_enabled, delta, rule.diff_low, rule.diff_high),
        ):
            if not enabled:
                continue
            passed = ((value >= low) & (value <= high)).double()
            metrics[f"train_infer_{rule.agg_type}_{kind}_mask_mean"] = float((passed * valid).sum()) / tokens
            keep = keep * passed
    kept = keep.bool() & valid
    if filters:
        had_tokens = valid.any(-1)
        metrics["train_infer_final_mask_mean"] = float(kept.sum()) / tokens
        metrics["train_infer_masked_tokens"] = float((valid & ~kept).sum())
        metrics["train_infer_masked_sequences"] = float((had_tokens & ~kept.any(-1)).sum())
    return (kept | ~valid).to(torch.float32), metrics
