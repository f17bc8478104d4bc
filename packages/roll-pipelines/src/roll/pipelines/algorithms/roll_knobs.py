"""ROLL's RLVR knobs that reshape rewards or mask whole samples (``norm_mean_type``/``norm_std_type``, the
REINFORCE return, ``difficulty_mask``, ``error_max_len_clip``), with ROLL's semantics.

* :func:`normalize_rewards`: subtract a mean (batch, group or none) and divide by a std (batch, group or none;
  unbiased, ``+1e-6``), per response.
* :func:`reinforce_returns`: the discounted return-to-go of token rewards (no baseline, no whitening).
* :func:`difficulty_mask`: keep samples whose group's mean score is strictly between ``low`` and ``high``.
* :func:`error_length_mask`: keep correct samples (score 1) and wrong ones (score 0) shorter than a threshold.
"""

from __future__ import annotations

from typing import Literal

import torch

from roll.pipelines.algorithms._validation import check_choice

__all__ = ["NormType", "difficulty_mask", "error_length_mask", "normalize_rewards", "reinforce_returns"]

NormType = Literal["batch", "group"] | None
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


@torch.no_grad()
def normalize_rewards(
    scores: torch.Tensor, group_index: torch.Tensor, mean_type: NormType, std_type: NormType
) -> torch.Tensor:
    """``(scores - mean) / (std + 1e-6)`` with ROLL's choices of mean and std (None: 0 and no division)."""
    for name, value in (("norm_mean_type", mean_type), ("norm_std_type", std_type)):
        if value is not None:
            check_choice(name, value, ("batch", "group"))
    scores = scores.float()
    group_mean, group_std = _group_mean_std(scores, group_index)
    mean: torch.Tensor | float = 0.0
    if mean_type == "batch":
        mean = scores.mean()
    elif mean_type == "group":
        mean = group_mean
    centred = scores - mean
    if std_type is None:
        return centred
    std = scores.std() if std_type == "batch" else group_std
    return centred / (std + _EPS)


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
