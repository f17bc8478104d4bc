"""Training losses: loss aggregation, PPO/GSPO policy loss, clipped value loss, KL and entropy terms, and
truncated importance-sampling weights for rollout/training mismatch.

Token-level inputs are (batch, response_len) with a ``response_mask`` of the same shape. Inputs are replaced by 0
outside the mask before any arithmetic, so padding garbage (``-inf`` log-probs) yields neither NaN values nor
NaN gradients. Metrics are Python floats computed without gradients; with no valid token they are 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from roll.pipelines.algorithms._masked import masked_mean
from roll.pipelines.algorithms._validation import (
    as_bool_mask,
    as_float,
    check_2d,
    check_choice,
    check_positive,
    check_same_shape,
)
from roll.pipelines.algorithms.kl import kl_penalty
from roll.runtime.errors import ConfigError

__all__ = [
    "LOSS_AGG_MODES",
    "aggregate_loss",
    "entropy_loss",
    "kl_loss",
    "policy_loss",
    "truncated_importance_weights",
    "value_loss",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# exp() of a log-ratio beyond this would overflow float32 or dominate the batch; such ratios are clipped anyway.
_LOG_RATIO_BOUND = 20.0

Count = int | float | torch.Tensor | None


def _check_count(name: str, value: Count) -> Count:
    # Tensors (e.g. a count all-reduced across ranks) are used as given, to avoid a device sync.
    if value is None or isinstance(value, torch.Tensor):
        return value
    return check_positive(name, value)


def _masked_inputs(
    response_mask: torch.Tensor, mask_name: str = "response_mask", **tensors: torch.Tensor | None
) -> list[Any]:
    """Check shapes against the mask and zero every tensor outside it (keeping gradients on valid entries).

    Returns one entry per keyword, in order: the masked tensor, or None where None was given (typed ``Any`` so
    callers that pass tensors need no narrowing)."""
    check_2d(mask_name, response_mask)
    check_same_shape(mask_name, response_mask, **tensors)
    valid = as_bool_mask(response_mask)
    out: list[Any] = []
    for tensor in tensors.values():
        if tensor is not None:
            tensor = as_float(tensor)
            tensor = torch.where(valid, tensor, tensor.new_zeros(()))
        out.append(tensor)
    return out


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Modes:
        ``"token-mean"``: sum over valid tokens / ``num_tokens`` (default: valid tokens in ``mask``).
        ``"seq-mean-token-sum"``: each sequence's token sum, summed, / ``num_seqs`` (default: batch size).
        ``"seq-mean-token-mean"``: each sequence's mean over its valid tokens, summed, / ``num_seqs``.
        ``"seq-mean-token-sum-norm"``: each sequence's token sum / ``norm_length`` (default:
        ``loss_mat.shape[-1]``), summed, / ``num_seqs`` (Dr. GRPO).

    With gradient accumulation pass the *global* ``num_tokens`` / ``num_seqs`` of the mini-batch: the micro-batch
    losses then add up to the mini-batch loss. A sequence with no valid token contributes 0.

    Args:
        loss_mat: (batch, response_len).
        mask: (batch, response_len), bool or float.

    Returns:
        A scalar tensor, differentiable w.r.t. ``loss_mat``.
    """
    check_choice("mode", mode, LOSS_AGG_MODES)
    check_2d("loss_mat", loss_mat)
    (kept,) = _masked_inputs(mask, "mask", loss_mat=loss_mat)
    valid = as_bool_mask(mask)
    num_tokens = _check_count("num_tokens", num_tokens)
    num_seqs = _check_count("num_seqs", num_seqs)
    if mode == "token-mean":
        denom = valid.sum().clamp(min=1).to(kept.dtype) if num_tokens is None else num_tokens
        return kept.sum() / denom
    per_seq = kept.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / valid.sum(dim=-1).clamp(min=1).to(kept.dtype)
    elif mode == "seq-mean-token-sum-norm":
        length = loss_mat.shape[-1] if norm_length is None else check_positive("norm_length", norm_length)
        per_seq = per_seq / length
    denom = max(loss_mat.shape[0], 1) if num_seqs is None else num_seqs
    return per_seq.sum() / denom


def _ratio(log_probs: torch.Tensor, log_ratio: torch.Tensor, valid: torch.Tensor, level: str) -> torch.Tensor:
    """Importance ratio per token: plain (``"token"``) or GSPO's sequence-level ratio (``"sequence"``)."""
    if level == "token":
        return torch.exp(log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
    # GSPO: s_i = exp(mean_t log_ratio) is a constant per sequence; exp(logp - sg(logp)) == 1 in value but has
    # gradient d/dlogp_t = 1, so d s_i,t / d logp_t = s_i and the sequence ratio's gradient is spread per token.
    seq_log_ratio = masked_mean(log_ratio.detach(), valid, dim=-1).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    return torch.exp(seq_log_ratio).unsqueeze(-1) * torch.exp(log_probs - log_probs.detach())


def _check_policy_args(clip_low: float, clip_high: float, dual_clip: float | None, ratio_level: str) -> None:
    check_choice("ratio_level", ratio_level, ("token", "sequence"))
    if check_positive("clip_low", clip_low, allow_zero=True) > 1:
        raise ConfigError(f"clip_low={clip_low!r} is not valid; it must be in [0, 1] (the ratio floor is 1 - clip_low)")
    check_positive("clip_high", clip_high, allow_zero=True)
    if dual_clip is not None and check_positive("dual_clip", dual_clip) <= 1:
        raise ConfigError(f"dual_clip={dual_clip!r} is not valid; it must be > 1 (e.g. 3.0), or None to disable")


def _metric_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    values = torch.stack([v.detach().to(torch.float64) for v in metrics.values()]).tolist()  # one device sync
    return dict(zip(metrics, values))


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate loss, with clip-higher, dual clip and GSPO sequence-level ratios.

    Per token: ``max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))``; with ``dual_clip = c`` the loss of
    tokens with ``A < 0`` is further capped at ``-A * c`` (Ye et al., 2020). ``ratio_level="sequence"`` (GSPO)
    replaces ``r`` by the sequence ratio ``s_i = exp(mean_t(logp - old_logp))`` whose gradient flows per token.
    ``is_weights`` (detached) multiply the per-token loss, e.g. from :func:`truncated_importance_weights`.

    Args:
        log_probs: (batch, response_len) current policy log-probs (differentiable).
        old_log_probs, advantages: same shape, treated as constants.
        response_mask: (batch, response_len).
        loss_agg_mode, num_tokens, num_seqs, norm_length: see :func:`aggregate_loss`.

    Returns:
        ``(loss, metrics)``: scalar loss and floats ``pg_clipfrac`` (valid tokens whose surrogate is clipped),
        ``pg_clipfrac_lower`` (dual clip active), ``ppo_kl`` (mean of ``old_logp - logp``), ``ratio_mean``,
        ``ratio_max``, ``ratio_min``.
    """
    _check_policy_args(clip_low, clip_high, dual_clip, ratio_level)
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    detached_is = is_weights.detach() if is_weights is not None else None
    old_detached, adv_detached = old_log_probs.detach(), advantages.detach()
    log_probs, old, adv, weights = _masked_inputs(
        response_mask, log_probs=log_probs, old_log_probs=old_detached, advantages=adv_detached, is_weights=detached_is
    )
    valid = as_bool_mask(response_mask)
    log_ratio = log_probs - old
    ratio = _ratio(log_probs, log_ratio, valid, ratio_level)

    loss_mat, clip_active, dual_active = _clipped_surrogate(adv, ratio, clip_low, clip_high, dual_clip)
    if weights is not None:
        loss_mat = loss_mat * weights
    loss = aggregate_loss(
        loss_mat, valid, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    return loss, _policy_metrics(ratio, log_ratio, clip_active, dual_active, valid)


def _clipped_surrogate(
    adv: torch.Tensor, ratio: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped PPO loss, and where the (upper/lower) clip and the dual clip are active."""
    surrogate = -adv * ratio
    clipped_surrogate = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(surrogate, clipped_surrogate)
    clip_active = clipped_surrogate > surrogate
    dual_active = torch.zeros_like(clip_active)
    if dual_clip is not None:
        # For A < 0 an unbounded ratio makes -A * r unbounded; cap it at -A * dual_clip.
        cap = -adv * dual_clip
        negative = adv < 0
        dual_active = negative & (loss_mat > cap)
        loss_mat = torch.where(negative, torch.minimum(loss_mat, cap), loss_mat)
    return loss_mat, clip_active, dual_active


@torch.no_grad()
def _policy_metrics(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    clip_active: torch.Tensor,
    dual_active: torch.Tensor,
    valid: torch.Tensor,
) -> dict[str, float]:
    ratio = ratio.detach()
    any_valid = valid.any()
    ratio_max = torch.where(valid, ratio, ratio.new_full((), -math.inf)).max()
    ratio_min = torch.where(valid, ratio, ratio.new_full((), math.inf)).min()
    return _metric_floats(
        {
            "pg_clipfrac": masked_mean(clip_active.to(ratio.dtype), valid),
            "pg_clipfrac_lower": masked_mean(dual_active.to(ratio.dtype), valid),
            "ppo_kl": masked_mean(-log_ratio.detach(), valid),
            "ratio_mean": masked_mean(ratio, valid),
            "ratio_max": torch.where(any_valid, ratio_max, ratio.new_zeros(())),
            "ratio_min": torch.where(any_valid, ratio_min, ratio.new_zeros(())),
        }
    )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip: float | None,
    loss_agg_mode: str = "token-mean",
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped value loss: ``0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)`` per token.

    ``clip=None`` gives the plain ``0.5 * (v - R)^2``.

    Args:
        values: (batch, response_len) current value predictions (differentiable).
        old_values, returns: same shape, treated as constants.
        response_mask: (batch, response_len).

    Returns:
        ``(loss, metrics)`` with ``vf_clipfrac``: fraction of valid tokens where the clipped term is the larger.
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    values, old, target = _masked_inputs(
        response_mask, values=values, old_values=old_values.detach(), returns=returns.detach()
    )
    valid = as_bool_mask(response_mask)
    unclipped = (values - target).square()
    if clip is None:
        loss_mat = 0.5 * unclipped
        clip_active = torch.zeros_like(valid)
    else:
        clip = check_positive("clip", clip)
        clipped_values = old + (values - old).clamp(-clip, clip)
        clipped = (clipped_values - target).square()
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)
        clip_active = clipped > unclipped
    loss = aggregate_loss(
        loss_mat, valid, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    with torch.no_grad():
        metrics = _metric_floats({"vf_clipfrac": masked_mean(clip_active, valid)})
    return loss, metrics


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kind: str = "k3",
    loss_agg_mode: str = "token-mean",
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """KL to the reference policy as a loss term (GRPO-style), aggregated like the policy loss.

    Args:
        log_probs: (batch, response_len), differentiable.
        ref_log_probs: same shape, treated as a constant.
        kind: KL estimator, see :func:`roll.pipelines.algorithms.kl_penalty`.

    Returns:
        Scalar tensor (add ``kl_coef * kl_loss`` to the total loss); it is also the KL metric.
    """
    log_probs, ref = _masked_inputs(response_mask, log_probs=log_probs, ref_log_probs=ref_log_probs.detach())
    per_token = kl_penalty(log_probs, ref, kind)
    return aggregate_loss(
        per_token, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )


def entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    num_tokens: Count = None,
    num_seqs: Count = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Aggregated per-token entropy (batch, response_len) -> scalar.

    The result is the entropy itself (positive); an entropy bonus is ``total = pg_loss - coef * entropy_loss``.
    """
    (entropy,) = _masked_inputs(response_mask, entropy=entropy)
    return aggregate_loss(
        entropy, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )


@torch.no_grad()
def truncated_importance_weights(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cap: float,
    level: str = "token",
    mode: str = "truncate",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights correcting for the rollout engine's log-probs differing from the trainer's.

    The ratio is ``exp(train - rollout)`` per token (``level="token"``), or the product of a sequence's token
    ratios ``exp(sum_t(train - rollout))`` broadcast to its tokens (``level="sequence"``). ``mode="truncate"``
    gives ``min(ratio, cap)``; ``mode="mask"`` gives 1 where ``ratio <= cap`` and 0 elsewhere. Ratios are
    compared with the cap in log space, so a huge sequence log-ratio never overflows.

    Args:
        train_log_probs, rollout_log_probs, response_mask: (batch, response_len).
        cap: upper bound on the ratio (> 0), e.g. 2.0.

    Returns:
        ``(weights, metrics)``: detached (batch, response_len) weights, 0 outside the mask, and floats
        ``is_capped_frac`` (valid tokens whose ratio exceeded the cap) and ``is_weight_mean`` (over valid tokens).
    """
    check_choice("level", level, ("token", "sequence"))
    check_choice("mode", mode, ("truncate", "mask"))
    log_cap = math.log(check_positive("cap", cap))
    train, rollout = _masked_inputs(
        response_mask, train_log_probs=train_log_probs.detach(), rollout_log_probs=rollout_log_probs.detach()
    )
    valid = as_bool_mask(response_mask)
    log_ratio = train - rollout
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    capped = log_ratio > log_cap
    if mode == "truncate":
        # min(exp(x), cap) == exp(min(x, log cap)), and the right-hand side cannot overflow.
        weights = torch.exp(log_ratio.clamp(max=log_cap))
    else:
        weights = (~capped).to(log_ratio.dtype)
    weights = torch.where(valid, weights, weights.new_zeros(()))
    metrics = _metric_floats(
        {"is_capped_frac": masked_mean(capped, valid), "is_weight_mean": masked_mean(weights, valid)}
    )
    return weights, metrics
