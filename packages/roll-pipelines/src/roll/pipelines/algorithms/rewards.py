"""Reward shaping: clipping, normalisation, token placement, dynamic-sampling filters and DAPO overlong shaping.

Everything here is computed without gradients (inputs are detached): rewards are targets, not functions of the
parameters being trained.
"""

from __future__ import annotations

import torch

from roll.pipelines.algorithms._groups import group_stats
from roll.pipelines.algorithms._validation import (
    as_bool_mask,
    as_float,
    check_1d,
    check_2d,
    check_choice,
    check_positive,
    check_same_shape,
    check_shape,
)
from roll.runtime.errors import ConfigError

__all__ = [
    "NORMALIZE_MODES",
    "clip_rewards",
    "clip_rewards_counted",
    "normalize_scores",
    "overlong_mask",
    "overlong_penalty",
    "token_level_rewards_from_scores",
    "zero_variance_group_mask",
]

NORMALIZE_MODES = ("group", "batch", "none")


@torch.no_grad()
def clip_rewards(scores: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Clamp rewards to ``[-clip, clip]``; ``clip=None`` returns them unchanged. Any shape."""
    scores = as_float(scores.detach())
    if clip is None:
        return scores.clone()
    clip = check_positive("clip", clip)
    return scores.clamp(-clip, clip)


@torch.no_grad()
def clip_rewards_counted(
    scores: torch.Tensor,
    clip: float | None,
    metrics: dict[str, float],
    key: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`clip_rewards`, recording in ``metrics[key]`` the share of entries the clamp changed when ``clip`` is set.

    ``mask`` (same shape, 1 = counted) limits the share to real entries, so a padded token tensor's padding does not
    count as unclipped; without it every entry counts. An empty selection records 0.0.
    """
    if clip is not None:
        check_same_shape("scores", scores, mask=mask)
        beyond = scores.detach().abs() > clip
        if mask is not None:
            beyond = beyond[as_bool_mask(mask)]
        metrics[key] = float(beyond.float().mean()) if beyond.numel() else 0.0
    return clip_rewards(scores, clip)


@torch.no_grad()
def normalize_scores(
    scores: torch.Tensor,
    group_index: torch.Tensor | None,
    mode: str,
    use_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Centre (and optionally scale) response-level scores within each group or over the batch.

    ``mode="group"``: ``(s - group_mean) / (group_std + eps)``; ``"batch"``: the same with the whole batch as one
    group; ``"none"``: unchanged. The std is unbiased (``torch.std``); a group (or batch) of one sample uses
    std 1, and its centred score is 0. ``use_std=False`` only subtracts the mean.

    Args:
        scores: (batch,) float.
        group_index: (batch,) integer group ids in any order; required for ``"group"``, ignored otherwise.

    Returns:
        (batch,) normalised scores.
    """
    check_choice("mode", mode, NORMALIZE_MODES)
    check_1d("scores", scores)
    scores = as_float(scores.detach())
    if mode == "none":
        return scores.clone()
    if mode == "group":
        if group_index is None:
            raise ConfigError("group_index=None is not valid for mode='group'; pass the (batch,) group ids")
        stats = group_stats(scores, group_index)
        mean, std, count = stats.mean, stats.std, stats.count
    else:
        n = scores.shape[0]
        mean = scores.mean().expand(n)
        std = (scores.std() if n > 1 else scores.new_zeros(())).expand(n)
        count = torch.full_like(scores, n)
    centred = scores - mean
    if not use_std:
        return centred
    # A lone sample has no spread to estimate; std 1 leaves its (zero) centred score untouched.
    std = torch.where(count > 1, std, torch.ones_like(std))
    return centred / (std + eps)


@torch.no_grad()
def token_level_rewards_from_scores(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Spread response-level scores over tokens: the score sits on each row's last valid token.

    ``kl_coef * kl`` is subtracted on every valid token (the in-reward KL penalty of classic RLHF PPO).

    Args:
        scores: (batch,) float.
        response_mask: (batch, response_len); every row must have at least one valid token.
        kl: optional (batch, response_len) per-token KL estimate (see :func:`kl_penalty`).
        kl_coef: weight of the KL penalty (>= 0).

    Returns:
        (batch, response_len) token-level rewards, 0 outside the mask.
    """
    check_2d("response_mask", response_mask)
    batch, length = response_mask.shape
    check_1d("scores", scores, batch)
    scores = as_float(scores.detach())
    valid = as_bool_mask(response_mask).to(scores.device)
    positions = torch.arange(length, device=scores.device).expand(batch, length)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=-1).values
    empty = (last < 0).nonzero().flatten().tolist()
    if empty:
        raise ConfigError(f"response_mask has no valid token in row(s) {empty}; every response needs >= 1 token")
    rewards = torch.zeros((batch, length), dtype=scores.dtype, device=scores.device)
    rewards.scatter_(1, last.unsqueeze(1), scores.unsqueeze(1))
    if kl is not None:
        check_shape("kl", kl, (batch, length), expected="(batch, response_len), like response_mask")
        kl_coef = check_positive("kl_coef", kl_coef, allow_zero=True)
        kl = torch.where(valid, kl.detach().to(scores.dtype), scores.new_zeros(()))
        rewards = rewards - kl_coef * kl
    return rewards


@torch.no_grad()
def zero_variance_group_mask(scores: torch.Tensor, group_index: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Which samples belong to a group whose scores vary (DAPO dynamic sampling keeps these).

    A group whose samples all got the same score yields zero GRPO advantage everywhere, i.e. no learning signal.

    Args:
        scores: (batch,) float.
        group_index: (batch,) integer group ids in any order.
        eps: a group counts as varying when its unbiased score std exceeds ``eps``.

    Returns:
        (batch,) bool, True for samples of a varying group; always False for groups of size 1.
    """
    check_1d("scores", scores)
    stats = group_stats(as_float(scores.detach()), group_index)
    return stats.std > eps


def _check_lengths(response_lengths: torch.Tensor, max_response_length: int) -> torch.Tensor:
    check_1d("response_lengths", response_lengths)
    if isinstance(max_response_length, bool) or not isinstance(max_response_length, int) or max_response_length <= 0:
        raise ConfigError(f"max_response_length={max_response_length!r} is not valid; it must be an int > 0")
    return as_float(response_lengths.detach())


@torch.no_grad()
def overlong_penalty(
    response_lengths: torch.Tensor,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float,
) -> torch.Tensor:
    """DAPO soft overlong punishment, added to each sample's reward.

    0 for lengths up to ``max_response_length - buffer_length``, then falling linearly to ``-penalty_factor``
    at ``max_response_length``, and ``-penalty_factor`` beyond it.

    Args:
        response_lengths: (batch,) number of response tokens per sample (int or float).
        max_response_length: generation length limit (> 0).
        buffer_length: width of the linear ramp, in ``(0, max_response_length]``.
        penalty_factor: magnitude of the full penalty (>= 0).

    Returns:
        (batch,) penalties <= 0, float (the lengths' dtype if floating, else the default dtype).
    """
    lengths = _check_lengths(response_lengths, max_response_length)
    if (
        isinstance(buffer_length, bool)
        or not isinstance(buffer_length, int)
        or not 0 < buffer_length <= max_response_length
    ):
        raise ConfigError(
            f"buffer_length={buffer_length!r} is not valid; it must be an int in (0, max_response_length="
            f"{max_response_length}]"
        )
    penalty_factor = check_positive("penalty_factor", penalty_factor, allow_zero=True)
    excess = lengths - (max_response_length - buffer_length)
    return (-excess / buffer_length * penalty_factor).clamp(-penalty_factor, 0.0)


@torch.no_grad()
def overlong_mask(response_lengths: torch.Tensor, max_response_length: int) -> torch.Tensor:
    """(batch,) bool, False for truncated samples (``length >= max_response_length``) — DAPO overlong filtering."""
    return _check_lengths(response_lengths, max_response_length) < max_response_length
