"""ROLL's policy-gradient variants (``pg_variant`` of its ActorPGWorker) besides PPO-clip, as per-token losses, and
ROLL's score-split loss terms (``postive_loss_coef``, ``use_topr_neg_loss_coef``).

With ``r = exp(logp - old_logp)``, ``A`` the advantage, ``sg`` stop-gradient and
``clipped_is(low, high) = -sg(clip(r, low, high)) * A * logp`` (REINFORCE weighted by a clipped importance ratio),
the per-token loss is:

* ``vanilla``: ``-A * logp`` (REINFORCE; no importance ratio).
* ``tis``: ``clipped_is(tis_lower, tis_upper)`` (truncated importance sampling, default [0, 1]).
* ``topr`` (tapered off-policy REINFORCE): samples with score > 0 get ``-w+ * A * logp`` (no ratio); the others
  ``w- * clipped_is(0, 1)``.
* ``cispo`` (MiniMax-M1): ``clipped_is(1 - eps_low, 1 + eps_high)``; with ``unified_mask`` the tokens with
  ``A > 0, r > 1 + eps_high`` or ``A < 0, r < 1 - eps_low`` are dropped (loss 0).
* ``kimi15`` (Kimi k1.5): ``-A * logp + tau / 2 * (logp - old_logp)^2``.

ROLL reads the TIS bounds, CISPO epsilons and Kimi tau from the actor role with these defaults but its role config
has no such fields, so under ROLL they are always the defaults; here they are settings. The loss matrix is then
weighted (importance weights, sample weights) and aggregated like PPO's (:func:`~.losses.aggregate_loss`).

:func:`score_split_loss` is the pair of terms ROLL's RLVR ActorWorker added to its loss up to v0.1 (TOPR before
``pg_variant`` existed): ``positive_coef * agg(-A * logp over score > 0 samples) + negative_coef *
agg(clipped_is(0, 1) over score <= 0 samples)``, each without sample weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.pipelines.algorithms._masked import masked_mean
from roll.pipelines.algorithms._validation import as_bool_mask, check_choice
from roll.pipelines.algorithms.losses import LOSS_AGG_MODES, Count, _masked_inputs, _metric_floats, aggregate_loss
from roll.runtime.errors import ConfigError

__all__ = [
    "PG_VARIANTS",
    "PGVariantParams",
    "clipped_is_loss",
    "pg_variant_loss",
    "pg_variant_loss_matrix",
    "score_split_loss",
]

PG_VARIANTS = ("ppo", "vanilla", "tis", "topr", "cispo", "kimi15")
_LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class PGVariantParams:
    """The variants' constants, with ROLL's defaults; the one place their ranges are checked."""

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
            raise ConfigError(
                f"cispo_epsilon_low must be in [0, 1] and cispo_epsilon_high >= 0, got {self.cispo_epsilon_low!r}, "
                f"{self.cispo_epsilon_high!r}"
            )
        for name in ("kimi15_tau", "topr_positive_weight", "topr_negative_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")


def clipped_is_loss(
    ratio: torch.Tensor, low: float, high: float, advantages: torch.Tensor, log_probs: torch.Tensor
) -> torch.Tensor:
    """``-sg(clip(ratio, low, high)) * A * logp`` per token: REINFORCE weighted by a clipped importance ratio."""
    return -ratio.detach().clamp(low, high) * advantages * log_probs


def _clip_share(ratio: torch.Tensor, low: float, high: float, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    below, above = (ratio < low).float(), (ratio > high).float()
    return {"pg_clipfrac_lower": masked_mean(below, valid), "pg_clipfrac_upper": masked_mean(above, valid)}


def _bounds(variant: str, p: PGVariantParams) -> tuple[float, float]:
    """The ratio clip of the clipped-IS variants (topr: of its score <= 0 samples)."""
    if variant == "tis":
        return p.tis_lower_bound, p.tis_upper_bound
    if variant == "cispo":
        return 1.0 - p.cispo_epsilon_low, 1.0 + p.cispo_epsilon_high
    return 0.0, 1.0


def _positive(scores: torch.Tensor | None, like: torch.Tensor, what: str) -> torch.Tensor:
    """(batch, 1) 1.0 for samples whose score is > 0."""
    if scores is None:
        raise ConfigError(f"{what} needs the responses' scores (batch field 'scores')")
    return (scores > 0).to(like.dtype).unsqueeze(-1)


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
    check_choice("pg_variant", variant, PG_VARIANTS[1:])
    p = params or PGVariantParams()
    log_ratio = (log_probs - old_log_probs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio).detach()
    metrics: dict[str, torch.Tensor] = {}
    if variant == "vanilla":
        loss = -advantages * log_probs
    elif variant == "kimi15":
        loss = -advantages * log_probs + 0.5 * p.kimi15_tau * (log_probs - old_log_probs) ** 2
        metrics["kimi15_log_ratio_sq"] = masked_mean(log_ratio.detach() ** 2, valid)
    else:  # tis, topr, cispo: REINFORCE under a clipped importance ratio
        low, high = _bounds(variant, p)
        loss = clipped_is_loss(ratio, low, high, advantages, log_probs)
        metrics.update(_clip_share(ratio, low, high, valid))
        if variant == "topr":
            positive = _positive(scores, log_probs, "pg_variant topr")
            reinforce = -advantages * log_probs
            loss = p.topr_positive_weight * positive * reinforce + p.topr_negative_weight * (1 - positive) * loss
            metrics["topr_positive_share"] = positive.mean()
        elif variant == "cispo" and p.cispo_unified_mask:
            dropped = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
            loss = torch.where(dropped, loss.new_zeros(()), loss)
            metrics["cispo_dropped"] = masked_mean(dropped.float(), valid)
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


def score_split_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    scores: torch.Tensor | None,
    *,
    positive_coef: float,
    negative_coef: float,
    loss_agg_mode: str = "token-mean",
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """ROLL's ``postive_loss_coef`` / ``use_topr_neg_loss_coef`` terms (see the module docstring), summed.

    Each term is aggregated over the tokens of its own samples (the other samples contribute 0) with the same
    ``num_tokens`` / ``num_seqs`` as the policy loss; a coefficient of 0 skips its term.
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    log_probs, old, adv = _masked_inputs(
        response_mask, log_probs=log_probs, old_log_probs=old_log_probs.detach(), advantages=advantages.detach()
    )
    valid = as_bool_mask(response_mask)
    positive = _positive(scores, log_probs, "positive_loss_coef / topr_negative_loss_coef").bool()
    total = log_probs.new_zeros(())
    metrics: dict[str, torch.Tensor] = {}
    if positive_coef:
        term = aggregate_loss(
            -adv * log_probs,
            valid & positive,
            loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length,
        )
        total = total + positive_coef * term
        metrics["positive_loss"] = term.detach()
    if negative_coef:
        ratio = torch.exp((log_probs - old).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
        loss_mat = clipped_is_loss(ratio, 0.0, 1.0, adv, log_probs)
        term = aggregate_loss(
            loss_mat,
            valid & ~positive,
            loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length,
        )
        total = total + negative_coef * term
        metrics["topr_neg_loss"] = term.detach()
    return total, (_metric_floats(metrics) if metrics else {})
