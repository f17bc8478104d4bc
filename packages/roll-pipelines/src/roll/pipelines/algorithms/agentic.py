"""Agentic (multi-turn) RL maths: ROLL's ``reward_normalization``, per-step discounted returns, GiGPO,
``step_reinforce`` and ``agentic_reinforce``.

Conventions as the rest of :mod:`roll.pipelines.algorithms`: response-level tensors are (batch,), token-level ones
(batch, response_len) with a ``response_mask``; groups are integer id tensors in any order (use
:func:`labels_to_index` to turn string columns such as ``traj_group_id`` or ``state_hash`` into ids).

Two sample layouts feed these functions:

* trajectory-wise: one row per episode; its response holds every assistant turn, separated by environment tokens
  that are outside the mask. :func:`agentic_reinforce_advantages` treats each maximal run of valid tokens (one
  assistant turn) as a segment.
* step-wise: one row per turn, with ``traj_index`` and ``step_index`` columns. :func:`step_discounted_returns` turns
  per-step rewards into returns-to-go; GiGPO normalises the episode score within episode groups and the step
  return within groups of identical states (:func:`gigpo_rewards`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch

from roll.pipelines.algorithms._groups import _dense_ids, group_stats
from roll.pipelines.algorithms._validation import as_bool_mask, as_float, check_1d, check_2d, check_same_shape
from roll.runtime.errors import ConfigError

__all__ = [
    "NORM_TYPES",
    "REWARD_NORM_METHODS",
    "GigpoRewards",
    "agentic_reinforce_advantages",
    "gigpo_rewards",
    "grouped_reward_norm",
    "labels_to_index",
    "reinforce_returns",
    "reward_norm_types",
    "segment_masked_mean",
    "state_group_index",
    "step_discounted_returns",
    "step_reinforce_rewards",
]

REWARD_NORM_METHODS = ("identity", "mean", "mean_std", "asym_clip")
"""ROLL's ``reward_normalization.method`` values (it only derives the mean/std types below)."""
NORM_TYPES = ("batch", "group")
"""Where a mean or std is taken: over the whole batch or within each sample's group; ``None`` skips it."""


def _check_type(name: str, value: str | None) -> str | None:
    if value is not None and value not in NORM_TYPES:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {list(NORM_TYPES)} or None")
    return value


def reward_norm_types(method: str, grouping: str) -> tuple[str | None, str | None]:
    """``(norm_mean_type, norm_std_type)`` that ROLL derives from ``method`` and ``grouping``.

    ``grouping="batch"`` takes statistics over the whole batch, any other grouping (a column name such as
    ``traj_group_id``, ``tags`` or ``state_group_id``) within each group. ``identity`` -> no normalisation,
    ``mean`` -> subtract the mean, ``mean_std``/``asym_clip`` -> subtract the mean and divide by the std.
    """
    if method not in REWARD_NORM_METHODS:
        raise ConfigError(f"reward_normalization.method={method!r} is not valid; choose one of {REWARD_NORM_METHODS}")
    scope = "batch" if grouping == "batch" else "group"
    if method == "identity":
        return None, None
    if method == "mean":
        return scope, None
    return scope, scope


def labels_to_index(labels: Sequence[Hashable]) -> torch.Tensor:
    """Dense int64 ids for arbitrary hashable labels (strings, tuples), numbered in first-seen order."""
    ids: dict[Hashable, int] = {}
    try:
        out = [ids.setdefault(label, len(ids)) for label in labels]
    except TypeError as e:
        raise ConfigError(f"group labels must be hashable ({e})") from None
    return torch.tensor(out, dtype=torch.long)


def _batch_std(scores: torch.Tensor) -> torch.Tensor:
    return scores.std() if scores.numel() > 1 else scores.new_zeros(())


@torch.no_grad()
def grouped_reward_norm(
    scores: torch.Tensor,
    group_index: torch.Tensor | None,
    mean_type: str | None,
    std_type: str | None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Normalise response-level scores as ROLL's ``reward_normalization`` does.

    The mean subtracted is the batch mean (``mean_type="batch"``), the group mean (``"group"``) or 0 (``None``).
    With ``std_type`` set, the centred score is divided by ``std + eps`` (unbiased batch or group std); a sample
    whose group has a single member, or whose std is ``<= eps``, gets 0 (no spread, no signal).

    Args:
        scores: (batch,) float.
        group_index: (batch,) integer group ids (any order); ``None`` makes the whole batch one group.

    Returns:
        (batch,) normalised scores.
    """
    _check_type("norm_mean_type", mean_type)
    _check_type("norm_std_type", std_type)
    check_1d("scores", scores)
    scores = as_float(scores.detach())
    n = scores.shape[0]
    if group_index is None:
        group_index = torch.zeros(n, dtype=torch.long)
    stats = group_stats(scores, group_index)
    if mean_type == "batch":
        mean = scores.mean().expand(n)
    elif mean_type == "group":
        mean = stats.mean
    else:
        mean = scores.new_zeros(n)
    centred = scores - mean
    if std_type is None:
        return centred
    std = _batch_std(scores).expand(n) if std_type == "batch" else stats.std
    usable = (stats.count > 1) & (std.abs() > eps)
    return torch.where(usable, centred / (std + eps), scores.new_zeros(()))


@torch.no_grad()
def step_discounted_returns(
    step_scores: torch.Tensor, traj_index: torch.Tensor, step_index: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Returns-to-go of step-wise samples: ``G_t = r_t + gamma * G_{t+1}`` within each trajectory.

    Rows may come in any order; a trajectory's rows are ordered by ``step_index`` (which must be unique within
    it). The return after a trajectory's last row is 0.

    Args:
        step_scores: (batch,) reward of each step.
        traj_index: (batch,) integer trajectory ids.
        step_index: (batch,) integer step number of each row within its trajectory.
        gamma: discount in [0, 1].

    Returns:
        (batch,) returns, aligned with the input rows.
    """
    if not 0 <= gamma <= 1:
        raise ConfigError(f"gamma={gamma!r} is not valid; it must be in [0, 1]")
    check_1d("step_scores", step_scores)
    n = step_scores.shape[0]
    rewards = as_float(step_scores.detach())
    trajs, n_trajs = _dense_ids(traj_index, n)
    check_1d("step_index", step_index, n)
    steps = step_index.to(torch.long)
    if n == 0:
        return rewards.clone()
    # Rank of each row within its trajectory by step number: sort by step, then (stably) by trajectory.
    by_step = torch.argsort(steps, stable=True)
    order = by_step[torch.argsort(trajs[by_step], stable=True)]
    sorted_trajs, sorted_steps = trajs[order], steps[order]
    same = (sorted_trajs[1:] == sorted_trajs[:-1]) & (sorted_steps[1:] == sorted_steps[:-1])
    if bool(same.any()):
        raise ConfigError("step_discounted_returns: a trajectory has two rows with the same step_index")
    first = torch.ones(n, dtype=torch.bool)
    first[1:] = sorted_trajs[1:] != sorted_trajs[:-1]
    starts = torch.nonzero(first).flatten()
    rank_sorted = torch.arange(n) - starts[torch.cumsum(first.long(), 0) - 1]
    rank = torch.empty_like(rank_sorted)
    rank[order] = rank_sorted
    # Dense (trajectory, rank) table, then one backward scan over ranks for all trajectories at once.
    width = int(rank.max()) + 1
    table = rewards.new_zeros((n_trajs, width))
    table[trajs, rank] = rewards
    returns = torch.zeros_like(table)
    running = rewards.new_zeros(n_trajs)
    for col in reversed(range(width)):
        running = table[:, col] + gamma * running
        returns[:, col] = running
    return returns[trajs, rank]


def state_group_index(episode_group_index: torch.Tensor, state_index: torch.Tensor) -> torch.Tensor:
    """Dense ids of (episode group, state) pairs: GiGPO compares steps only within the same episode group.

    (ROLL keys its state groups by the state hash alone, which merges equal states of different episode groups;
    here two rows share a state group only if they also share an episode group.)
    """
    check_1d("episode_group_index", episode_group_index)
    check_1d("state_index", state_index, episode_group_index.shape[0])
    pairs = list(zip(episode_group_index.tolist(), state_index.tolist()))
    return labels_to_index(pairs)


class GigpoRewards(NamedTuple):
    """GiGPO's response-level rewards and their two parts, each (batch,)."""

    rewards: torch.Tensor
    """``episode_reward_weight * episode + step_reward_weight * step``."""
    episode: torch.Tensor
    """Episode scores normalised within episode groups."""
    step: torch.Tensor
    """Step returns normalised within state groups."""


@torch.no_grad()
def gigpo_rewards(
    episode_scores: torch.Tensor,
    step_returns: torch.Tensor,
    episode_group_index: torch.Tensor | None,
    state_group: torch.Tensor,
    *,
    episode_reward_weight: float = 1.0,
    step_reward_weight: float = 1.0,
    episode_norm: tuple[str | None, str | None] = ("group", "group"),
    step_norm: tuple[str | None, str | None] = ("group", "group"),
    eps: float = 1e-6,
) -> GigpoRewards:
    """GiGPO (Feng et al., 2025): episode-level plus step-level relative advantages for step-wise samples.

    The episode part normalises each row's episode score within ``episode_group_index`` (the episodes that share a
    seed) with ``episode_norm = (mean_type, std_type)``; the step part normalises each row's discounted step return
    (:func:`step_discounted_returns`) within ``state_group`` (rows that saw the same state in the same episode
    group, :func:`state_group_index`) with ``step_norm``. See :func:`grouped_reward_norm` for the types.

    Args:
        episode_scores, step_returns, state_group: (batch,).
        episode_group_index: (batch,) ids, or ``None`` for one batch-wide group.

    Returns:
        :class:`GigpoRewards`.
    """
    check_1d("episode_scores", episode_scores)
    n = episode_scores.shape[0]
    check_1d("step_returns", step_returns, n)
    check_1d("state_group", state_group, n)
    episode = grouped_reward_norm(episode_scores, episode_group_index, *episode_norm, eps=eps)
    step = grouped_reward_norm(step_returns, state_group, *step_norm, eps=eps)
    step = step.to(episode.dtype)
    return GigpoRewards(episode_reward_weight * episode + step_reward_weight * step, episode, step)


@torch.no_grad()
def step_reinforce_rewards(
    step_returns: torch.Tensor,
    group_index: torch.Tensor | None,
    mean_type: str | None,
    std_type: str | None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``step_reinforce``: each step-wise row is rewarded with its normalised discounted step return."""
    return grouped_reward_norm(step_returns, group_index, mean_type, std_type, eps=eps)


def _token_inputs(rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_2d("response_mask", response_mask)
    check_same_shape("response_mask", response_mask, token_level_rewards=rewards)
    valid = as_bool_mask(response_mask)
    rewards = as_float(rewards.detach())
    return torch.where(valid, rewards, rewards.new_zeros(())), valid


@torch.no_grad()
def reinforce_returns(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain REINFORCE returns-to-go over each row's valid tokens (ROLL's ``reinforce``/``grpo``/``gigpo``/
    ``step_reinforce`` advantage step); the advantages equal the returns.

    Unlike ROLL, positions outside the mask (environment tokens of a multi-turn row, padding) do not count as
    time steps, so ``gamma < 1`` discounts per generated token only. With ``gamma = 1`` the two agree.

    Returns:
        ``(advantages, returns)``, (batch, response_len), 0 outside the mask.
    """
    if not 0 <= gamma <= 1:
        raise ConfigError(f"gamma={gamma!r} is not valid; it must be in [0, 1]")
    rewards, valid = _token_inputs(token_level_rewards, response_mask)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = valid[:, t]
        running = torch.where(m, rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(m, running, rewards.new_zeros(()))
    return returns, returns.clone()


def _segments(valid: torch.Tensor) -> tuple[torch.Tensor, int]:
    """1-based id of the contiguous valid segment each token belongs to (0 outside the mask), and the max count."""
    prev = torch.zeros_like(valid)
    prev[:, 1:] = valid[:, :-1]
    starts = valid & ~prev
    ids = torch.where(valid, torch.cumsum(starts.long(), dim=1), torch.zeros((), dtype=torch.long))
    return ids, int(ids.max()) if ids.numel() else 0


@torch.no_grad()
def agentic_reinforce_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``agentic_reinforce``: returns discounted per turn, not per token.

    Each maximal run of valid tokens (one assistant turn in a trajectory-wise row) is a segment ``k`` with reward
    ``R_k`` (the sum of its token rewards; rewards usually sit on a turn's last token). Its return is
    ``G_k = R_k + gamma * G_{k+1}``, and every token of the segment gets ``G_k``.

    Returns:
        ``(advantages, returns)``, equal, (batch, response_len), 0 outside the mask.
    """
    if not 0 <= gamma <= 1:
        raise ConfigError(f"gamma={gamma!r} is not valid; it must be in [0, 1]")
    rewards, valid = _token_inputs(token_level_rewards, response_mask)
    seg, n_seg = _segments(valid)
    batch = rewards.shape[0]
    seg_rewards = rewards.new_zeros((batch, n_seg + 1)).scatter_add_(1, seg, rewards)
    seg_returns = torch.zeros_like(seg_rewards)
    running = rewards.new_zeros(batch)
    for k in range(n_seg, 0, -1):
        running = seg_rewards[:, k] + gamma * running
        seg_returns[:, k] = running
    returns = torch.where(valid, seg_returns.gather(1, seg), rewards.new_zeros(()))
    return returns, returns.clone()


def segment_masked_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over each contiguous valid segment (one assistant turn), broadcast to its tokens.

    Used for segment-level importance ratios (ROLL's ``ratio_type: segment``), so gradients flow through it.
    (batch, response_len) in and out, 0 outside the mask.
    """
    check_2d("response_mask", response_mask)
    check_same_shape("response_mask", response_mask, values=values)
    valid = as_bool_mask(response_mask)
    values = as_float(values)
    seg, n_seg = _segments(valid)
    kept = torch.where(valid, values, values.new_zeros(()))
    sums = values.new_zeros((values.shape[0], n_seg + 1)).scatter_add(1, seg, kept)
    counts = values.new_zeros((values.shape[0], n_seg + 1)).scatter_add(1, seg, valid.to(values.dtype))
    means = sums / counts.clamp(min=1)
    return torch.where(valid, means.gather(1, seg), values.new_zeros(()))
