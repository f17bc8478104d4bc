"""Advantage estimators. Each returns ``(advantages, returns)``, both (batch, response_len), 0 outside the mask.

All estimators run without gradients on detached inputs: advantages and returns are regression/weighting targets.
Recursions over time (GAE, returns-to-go) run over the *valid* tokens of each row only: an invalid position
neither contributes a reward or value nor breaks the chain, so right padding (and, for multi-turn masks,
interleaved non-response tokens) cannot leak into the result, and the value after the last valid token is 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from roll.pipelines.algorithms._groups import group_stats
from roll.pipelines.algorithms._masked import masked_whiten
from roll.pipelines.algorithms._validation import (
    as_bool_mask,
    as_float,
    check_1d,
    check_2d,
    check_choice,
    check_positive,
    check_same_shape,
)
from roll.pipelines.algorithms.rewards import clip_rewards_counted, normalize_scores
from roll.runtime.errors import ConfigError

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "compute_advantages",
    "gae_advantages",
    "grpo_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "rloo_advantages",
    "whiten_and_clip_advantages",
]

Advantages = tuple[torch.Tensor, torch.Tensor]
_ADV_CLIP_FRAC = "critic/advantage_clip_frac"  # the share of valid tokens advantage_clip clamped (ROLL's name)


def _check_unit_interval(name: str, value: float) -> float:
    value = check_positive(name, value, allow_zero=True)
    if value > 1:
        raise ConfigError(f"{name}={value!r} is not valid; it must be in [0, 1]")
    return value


def _token_inputs(response_mask: torch.Tensor, **tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Validate (batch, response_len) inputs; return them detached and zeroed outside the mask, plus the mask."""
    check_2d("response_mask", response_mask)
    valid = as_bool_mask(response_mask)
    out = []
    for name, tensor in tensors.items():
        check_same_shape("response_mask", response_mask, **{name: tensor})
        tensor = as_float(tensor.detach())
        out.append(torch.where(valid, tensor, tensor.new_zeros(())))
    return (*out, valid)


def _broadcast(per_seq: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(batch,) -> (batch, response_len): the row's value on its valid tokens, 0 elsewhere."""
    return torch.where(valid, per_seq.unsqueeze(-1), per_seq.new_zeros(()))


def _seq_inputs(scores: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_2d("response_mask", response_mask)
    check_1d("scores", scores, response_mask.shape[0])
    return as_float(scores.detach()), as_bool_mask(response_mask)


def _gae_scan(
    rewards: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Backward GAE recursion over valid tokens: ``A_t = delta_t + gamma * lam * A_next``."""
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    # State carried from the next *valid* token to the right; 0 beyond the last one (terminal bootstrap).
    next_value = rewards.new_zeros(batch)
    next_adv = rewards.new_zeros(batch)
    for t in reversed(range(length)):  # loop over time only; every row is updated at once
        m = valid[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(m, adv_t, advantages.new_zeros(()))
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, adv_t, next_adv)
    return advantages


@torch.no_grad()
def gae_advantages(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> Advantages:
    """Generalised advantage estimation (Schulman et al., 2016) for PPO.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t+1}``, with ``V`` and ``A``
    of the step after the last valid token taken as 0.

    Args:
        token_level_rewards, values, response_mask: (batch, response_len).
        gamma, lam: discount and GAE lambda, each in [0, 1].

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values`` on valid tokens.
    """
    gamma = _check_unit_interval("gamma", gamma)
    lam = _check_unit_interval("lam", lam)
    rewards, values, valid = _token_inputs(response_mask, token_level_rewards=token_level_rewards, values=values)
    values = values.to(rewards.dtype)
    advantages = _gae_scan(rewards, values, valid, gamma, lam)
    returns = torch.where(valid, advantages + values, advantages.new_zeros(()))
    return advantages, returns


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Advantages:
    """GRPO: ``(score - group_mean) / (group_std + eps)`` on every valid token of the response.

    The std is unbiased (``torch.std``); ``norm_by_std=False`` gives Dr. GRPO's mean-only centring. A group of
    one sample gets advantage 0.

    Args:
        scores: (batch,) response-level rewards.
        response_mask: (batch, response_len).
        group_index: (batch,) integer prompt/group ids, any order.

    Returns:
        ``(advantages, returns)``; returns equal the advantages.
    """
    scores, valid = _seq_inputs(scores, response_mask)
    normalised = normalize_scores(scores, group_index, "group", use_std=norm_by_std, eps=eps)
    advantages = _broadcast(normalised, valid)
    return advantages, advantages.clone()


@torch.no_grad()
def rloo_advantages(scores: torch.Tensor, response_mask: torch.Tensor, group_index: torch.Tensor) -> Advantages:
    """RLOO: each score minus the mean score of the *other* samples of its group; 0 for a group of one.

    Shapes as :func:`grpo_advantages`; returns equal the advantages.
    """
    scores, valid = _seq_inputs(scores, response_mask)
    stats = group_stats(scores, group_index)
    others = stats.count - 1
    loo_mean = (stats.sum - scores) / others.clamp(min=1)
    per_seq = torch.where(others > 0, scores - loo_mean, scores.new_zeros(()))
    advantages = _broadcast(per_seq, valid)
    return advantages, advantages.clone()


@torch.no_grad()
def reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> Advantages:
    """REINFORCE++: discounted returns-to-go over valid tokens, whitened over all valid tokens of the batch.

    Args:
        token_level_rewards, response_mask: (batch, response_len).
        gamma: discount in [0, 1].

    Returns:
        ``(advantages, returns)``: whitened returns-to-go and the raw (un-whitened) returns-to-go.
    """
    gamma = _check_unit_interval("gamma", gamma)
    rewards, valid = _token_inputs(response_mask, token_level_rewards=token_level_rewards)
    # Returns-to-go are GAE with V = 0 and lambda = 1: A_t = r_t + gamma * A_{t+1}.
    returns = _gae_scan(rewards, torch.zeros_like(rewards), valid, gamma, 1.0)
    return masked_whiten(returns, valid), returns


@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor, response_mask: torch.Tensor, group_index: torch.Tensor
) -> Advantages:
    """REINFORCE++-baseline: subtract the group mean score, broadcast to tokens, whiten over the batch's tokens.

    Whitening is over all valid tokens, so long responses weigh more in the batch statistics. Shapes as
    :func:`grpo_advantages`; returns equal the advantages.
    """
    scores, valid = _seq_inputs(scores, response_mask)
    centred = scores - group_stats(scores, group_index).mean
    advantages = masked_whiten(_broadcast(centred, valid), valid)
    return advantages, advantages.clone()


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Advantages]] = {
    "gae": gae_advantages,
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_plus_plus": reinforce_plus_plus_advantages,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
}
"""Estimator name -> function returning ``(advantages, returns)``."""


def compute_advantages(name: str, **kwargs: object) -> Advantages:
    """Run the estimator registered as ``name`` in :data:`ADVANTAGE_ESTIMATORS` with ``kwargs``."""
    check_choice("adv_estimator", name, ADVANTAGE_ESTIMATORS)
    estimator = ADVANTAGE_ESTIMATORS[name]
    signature = inspect.signature(estimator)
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"adv_estimator={name!r} cannot be called with arguments {sorted(kwargs)}: {exc}; "
            f"its parameters are {list(signature.parameters)}"
        ) from None
    return estimator(**kwargs)


@torch.no_grad()
def whiten_and_clip_advantages(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    whiten: bool,
    clip: float | None,
    metrics: dict[str, float] | None = None,
) -> torch.Tensor:
    """Optionally whiten advantages over the batch's valid tokens, then optionally clamp to ``[-clip, clip]``.

    Args:
        advantages, response_mask: (batch, response_len).
        metrics: when given and ``clip`` is set, ``critic/advantage_clip_frac`` (ROLL's name) records the share of
            valid tokens the clamp changed.

    Returns:
        (batch, response_len), 0 outside the mask.
    """
    advantages, valid = _token_inputs(response_mask, advantages=advantages)
    if whiten:
        advantages = masked_whiten(advantages, valid)
    if clip is not None:
        advantages = clip_rewards_counted(advantages, clip, {} if metrics is None else metrics, _ADV_CLIP_FRAC, valid)
    return advantages
