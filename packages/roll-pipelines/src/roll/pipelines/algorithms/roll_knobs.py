"""ROLL's RLVR knobs that reshape rewards or mask whole samples (``norm_mean_type``/``norm_std_type``, the
REINFORCE return, ``difficulty_mask``, ``error_max_len_clip``), with ROLL's semantics.

* :func:`normalize_rewards`: subtract a mean (batch, group, running or none) and divide by a std (batch, group,
  running or none; unbiased, ``+1e-6``), per response. ``running`` uses a :class:`RunningMoments` already updated
  with this batch's scores (ROLL updates first, then normalizes).
* :class:`RunningMoments`: the running mean and std of every score seen so far (parallel-variance update).
* :func:`whiten_token_rewards`: ROLL's ``whiten_rewards``: token rewards whitened over the batch's valid tokens
  (unbiased variance, ``+1e-8``), 0 outside the mask; left as they are with fewer than two valid tokens.
* :func:`reinforce_returns`: the discounted return-to-go of token rewards (no baseline, no whitening).
* :func:`difficulty_mask`: keep samples whose group's mean score is strictly between ``low`` and ``high``.
* :func:`error_length_mask`: keep correct samples (score 1) and wrong ones (score 0) shorter than a threshold.
* :func:`query_filter_mask`: ROLL's per-domain ``query_filter_config``: drop prompt groups by their mean score
  (``mean_filter``: mean <= threshold_down or >= threshold_up) or its unbiased std (``std_filter``: std <=
  std_threshold); a group of one sample is always kept.
* :func:`sample_loss_weights`: ROLL's ``difficulty_loss_weight`` / ``length_loss_weight`` per-sample weights.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from roll.pipelines.algorithms._masked import masked_whiten
from roll.pipelines.algorithms._validation import check_choice
from roll.runtime.errors import ConfigError

__all__ = [
    "NormType",
    "RunningMoments",
    "difficulty_mask",
    "error_length_mask",
    "normalize_rewards",
    "query_filter_mask",
    "reinforce_returns",
    "sample_loss_weights",
    "whiten_token_rewards",
]

NormType = Literal["batch", "group", "running"] | None
_EPS = 1e-6


def _group_mean_std(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and unbiased std of its group's scores (std 0 for a group of one)."""
    mean = torch.empty_like(scores)
    std = torch.zeros_like(scores)
    for group in torch.unique(group_index):
        members = group_index == group
        values = scores[members]
        mean[members] = values.mean()
        if values.numel() > 1:
            std[members] = values.std()
    return mean, std


class RunningMoments:
    """Running mean and std of a stream of scores (Chan et al.'s parallel update), starting from mean 0, var 1
    with a negligible weight, so the first update gives that batch's mean and unbiased std."""

    def __init__(self) -> None:
        self.mean, self.var, self.std, self.count = 0.0, 1.0, 1.0, 1e-24

    @torch.no_grad()
    def update(self, values: torch.Tensor) -> None:
        values = values.double().flatten()
        n = values.numel()
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_var = float(values.var(unbiased=False))
        total = self.count + n
        delta = batch_mean - self.mean
        spread = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var = spread / total
        self.std = (self.var * total / (total - 1)) ** 0.5 if total > 1 else 0.0
        self.count = total

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "std": self.std, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean, self.var, self.std, self.count = state["mean"], state["var"], state["std"], state["count"]


@torch.no_grad()
def normalize_rewards(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    mean_type: NormType,
    std_type: NormType,
    running: RunningMoments | None = None,
) -> torch.Tensor:
    """``(scores - mean) / (std + 1e-6)`` with ROLL's choices of mean and std (None: 0 and no division)."""
    for name, value in (("norm_mean_type", mean_type), ("norm_std_type", std_type)):
        if value is not None:
            check_choice(name, value, ("batch", "group", "running"))
    if running is None and "running" in (mean_type, std_type):
        raise ConfigError("norm_mean_type/norm_std_type 'running' needs the RunningMoments of the scores' domain")
    scores = scores.float()
    group_mean, group_std = _group_mean_std(scores, group_index)
    mean: torch.Tensor | float = 0.0
    if mean_type == "batch":
        mean = scores.mean()
    elif mean_type == "group":
        mean = group_mean
    elif mean_type == "running" and running is not None:
        mean = running.mean
    centred = scores - mean
    if std_type is None:
        return centred
    if std_type == "running" and running is not None:
        return centred / (running.std + _EPS)
    std = scores.std() if std_type == "batch" else group_std
    return centred / (std + _EPS)


@torch.no_grad()
def whiten_token_rewards(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """ROLL's ``whiten_rewards``: whitened over all valid tokens (needs >= 2 of them), then 0 outside the mask."""
    mask = response_mask.float()
    if int(mask.sum()) <= 1:
        return token_rewards * mask
    return masked_whiten(token_rewards, mask) * mask


@torch.no_grad()
def reinforce_returns(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both the return-to-go ``G_t = r_t + gamma * G_{t+1}`` over masked rewards."""
    rewards = token_level_rewards.float() * response_mask.float()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    returns = returns * response_mask.float()
    return returns, returns.clone()


@torch.no_grad()
def difficulty_mask(scores: torch.Tensor, group_index: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """1.0 for samples whose group's mean score is in the open interval ``(low, high)``, else 0.0."""
    mean, _ = _group_mean_std(scores.float(), group_index)
    return ((mean > low) & (mean < high)).float()


@torch.no_grad()
def error_length_mask(scores: torch.Tensor, response_lengths: torch.Tensor, threshold: int) -> torch.Tensor:
    """1.0 for correct samples (score 1) and wrong ones (score 0) shorter than ``threshold`` tokens, else 0.0."""
    keep = ((scores == 0) & (response_lengths < threshold)) | (scores == 1)
    return keep.float()


@torch.no_grad()
def query_filter_mask(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    kind: str,
    *,
    threshold_up: float = math.inf,
    threshold_down: float = -1.0,
    std_threshold: float = -1.0,
) -> torch.Tensor:
    """(batch,) bool: samples of the prompt groups the filter keeps."""
    check_choice("query_filter_config.type", kind, ("no_filter", "mean_filter", "std_filter"))
    keep = torch.ones(scores.shape[0], dtype=torch.bool)
    if kind == "no_filter":
        return keep
    scores = scores.double()
    for group in torch.unique(group_index):
        members = group_index == group
        values = scores[members]
        if values.numel() < 2:
            continue
        if kind == "mean_filter":
            mean = float(values.mean())
            keep[members] = not (mean <= threshold_down or mean >= threshold_up)
        else:
            keep[members] = not float(values.std()) <= std_threshold
    return keep


@torch.no_grad()
def sample_loss_weights(
    response_lengths: torch.Tensor, difficulty: torch.Tensor | None, *, use_difficulty: bool, use_length: bool
) -> torch.Tensor:
    """(batch,) weights of the samples' policy-gradient losses, averaging 1 over the batch.

    Difficulty (clamped to [0, 1]) gives ``0.5 + 1.5 * d``; length gives ``1.5 - (L - min L) / (max L - min L +
    1e-8)`` (shorter responses weigh more); the product is rescaled to sum to the batch size, as ROLL does per
    micro-batch."""
    lengths = response_lengths.double()
    weights = torch.ones_like(lengths)
    if use_difficulty:
        if difficulty is None:
            raise ConfigError("difficulty_loss_weight needs each sample's 'difficulty' (a data column in [0, 1])")
        weights = weights * (0.5 + 1.5 * difficulty.double().clamp(0.0, 1.0))
    if use_length:
        weights = weights * (1.5 - (lengths - lengths.min()) / (lengths.max() - lengths.min() + 1e-8))
    total = weights.sum()
    if total > 0:
        weights = weights * (lengths.numel() / (total + 1e-8))
    return weights.to(response_lengths.dtype if response_lengths.is_floating_point() else torch.float32)
