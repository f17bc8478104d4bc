"""ROLL's policy-gradient variants (``pg_variant`` of its ActorPGWorker) besides PPO-clip, as per-token losses.

With ``r = exp(logp - old_logp)``, ``A`` the advantage and ``sg`` stop-gradient, the per-token loss is:

* ``vanilla``: ``-A * logp`` (REINFORCE; no importance ratio).
* ``tis``: ``-sg(clip(r, tis_lower, tis_upper)) * A * logp`` (truncated importance sampling, default [0, 1]).
* ``topr`` (tapered off-policy REINFORCE): samples with score > 0 get ``-w+ * A * logp`` (no ratio); the others
  ``-w- * sg(clip(r, 0, 1)) * A * logp``.
* ``cispo`` (MiniMax-M1): ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp``; with ``unified_mask`` the tokens
  with ``A > 0, r > 1 + eps_high`` or ``A < 0, r < 1 - eps_low`` are dropped (loss 0).
* ``kimi15`` (Kimi k1.5): ``-A * logp + tau / 2 * (logp - old_logp)^2``.

ROLL reads the TIS bounds, CISPO epsilons and Kimi tau from the actor role with these defaults but its role config
has no such fields, so under ROLL they are always the defaults; here they are settings. The loss matrix is then
weighted (importance weights, sample weights) and aggregated like PPO's (:func:`~.losses.aggregate_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.pipelines.algorithms._masked import masked_mean
from roll.pipelines.algorithms._validation import as_bool_mask, check_choice
from roll.pipelines.algorithms.losses import LOSS_AGG_MODES, Count, _masked_inputs, _metric_floats, aggregate_loss
from roll.runtime.errors import ConfigError

__all__ = ["PG_VARIANTS", "PGVariantParams", "pg_variant_loss", "pg_variant_loss_matrix"]

PG_VARIANTS = ("ppo", "vanilla", "tis", "topr", "cispo", "kimi15")
_LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class PGVariantParams:
    """The variants' constants, with ROLL's defaults."""

    tis_lower_bound: float = 0.0
    tis_upper_bound: float = 1.0
    topr_positive_weight: float = 1.0
    topr_negative_weight: float = 1.0
    cispo_epsilon_low: float = 0.1
    cispo_epsilon_high: float = 0.1
    cispo_unified_mask: bool = False
    kimi15_tau: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.tis_lower_bound <= self.tis_upper_bound:
            raise ConfigError(
                f"TIS bounds must satisfy 0 <= tis_lower_bound <= tis_upper_bound, "
                f"got {self.tis_lower_bound!r}, {self.tis_upper_bound!r}"
            )
        if not (0 <= self.cispo_epsilon_low <= 1 and self.cispo_epsilon_high >= 0):
            raise ConfigError("cispo_epsilon_low must be in [0, 1] and cispo_epsilon_high >= 0")
        if self.kimi15_tau < 0 or self.topr_positive_weight < 0 or self.topr_negative_weight < 0:
            raise ConfigError("kimi15_tau and the TOPR weights must be >= 0")


def _clip_share(ratio: torch.Tensor, low: float, high: float, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    below, above = (ratio < low).float(), (ratio > high).float()
    return {"pg_clipfrac_lower": masked_mean(below, valid), "pg_clipfrac_upper": masked_mean(above, valid)}


def pg_variant_loss_matrix(
    variant: str,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    *,
    scores: torch.Tensor | None = None,
    params: PGVariantParams | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-token loss (batch, len), metric tensors) of a non-PPO variant; inputs already zeroed off ``valid``.

    ``scores`` (batch,): the raw response scores, which split TOPR's positive and negative samples.
    """
    p = params or PGVariantParams()
    log_ratio = (log_probs - old_log_probs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio).detach()
    metrics: dict[str, torch.Tensor] = {}
    if variant == "vanilla":
        loss = -advantages * log_probs
    elif variant == "tis":
        loss = -ratio.clamp(p.tis_lower_bound, p.tis_upper_bound) * advantages * log_probs
        metrics = _clip_share(ratio, p.tis_lower_bound, p.tis_upper_bound, valid)
    elif variant == "topr":
        if scores is None:
            raise ConfigError("pg_variant topr needs the responses' scores (batch field 'scores')")
        positive = (scores > 0).to(log_probs.dtype).unsqueeze(-1)
        reinforce = -advantages * log_probs
        tapered = -ratio.clamp(0.0, 1.0) * advantages * log_probs
        loss = p.topr_positive_weight * positive * reinforce + p.topr_negative_weight * (1 - positive) * tapered
        metrics = {"topr_positive_share": positive.mean(), **_clip_share(ratio, 0.0, 1.0, valid)}
    elif variant == "cispo":
        low, high = 1.0 - p.cispo_epsilon_low, 1.0 + p.cispo_epsilon_high
        loss = -ratio.clamp(low, high) * advantages * log_probs
        if p.cispo_unified_mask:
            dropped = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
            loss = torch.where(dropped, loss.new_zeros(()), loss)
            metrics["cispo_dropped"] = masked_mean(dropped.float(), valid)
        metrics.update(_clip_share(ratio, low, high, valid))
    elif variant == "kimi15":
        loss = -advantages * log_probs + 0.5 * p.kimi15_tau * (log_probs - old_log_probs) ** 2
        metrics["kimi15_log_ratio_sq"] = masked_mean(log_ratio.detach() ** 2, valid)
    else:
        check_choice("pg_variant", variant, PG_VARIANTS[1:])
        raise AssertionError("unreachable")
    metrics.update({"ppo_kl": masked_mean(-log_ratio.detach(), valid), "ratio_mean": masked_mean(ratio, valid)})
    return loss, metrics


def pg_variant_loss(
    variant: str,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    scores: torch.Tensor | None = None,
    params: PGVariantParams | None = None,
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The aggregated loss of a non-PPO ``variant`` and its metrics (floats); arguments as :func:`policy_loss`."""
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    log_probs, old, adv, weights = _masked_inputs(
        response_mask,
        log_probs=log_probs,
        old_log_probs=old_log_probs.detach(),
        advantages=advantages.detach(),
        is_weights=None if is_weights is None else is_weights.detach(),
    )
    valid = as_bool_mask(response_mask)
    loss_mat, metrics = pg_variant_loss_matrix(variant, log_probs, old, adv, valid, scores=scores, params=params)
    if weights is not None:
        loss_mat = loss_mat * weights
    loss = aggregate_loss(
        loss_mat, valid, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    return loss, _metric_floats(metrics)
