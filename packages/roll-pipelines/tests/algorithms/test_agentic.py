"""Agentic estimators (reward normalisation by grouping, step returns, GiGPO, step_reinforce, agentic_reinforce)
against plain-Python references on fixed tensors."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms import (
    agentic_reinforce_advantages,
    gigpo_rewards,
    grouped_reward_norm,
    labels_to_index,
    reinforce_returns,
    reward_norm_types,
    segment_masked_mean,
    state_group_index,
    step_discounted_returns,
    step_reinforce_rewards,
)
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}
F64 = torch.float64


# ---- plain-Python references ------------------------------------------------------------------------------------


def _ref_norm(scores, groups, mean_type, std_type, eps=1e-6):
    """ROLL's agentic_reward_norm written out row by row."""
    batch_mean = sum(scores) / len(scores)
    batch_std = statistics.stdev(scores) if len(scores) > 1 else 0.0
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
        mean = {"batch": batch_mean, "group": sum(members) / len(members), None: 0.0}[mean_type]
        if std_type is None:
            out.append(s - mean)
            continue
        std = batch_std if std_type == "batch" else (statistics.stdev(members) if len(members) > 1 else 0.0)
        out.append((s - mean) / (std + eps) if len(members) > 1 and abs(std) > eps else 0.0)
    return out


def _ref_step_returns(rows, gamma):
    """rows: list of (traj, step, reward) in any order -> returns aligned with rows."""
    out = [0.0] * len(rows)
    for traj in {r[0] for r in rows}:
        members = sorted((i for i, r in enumerate(rows) if r[0] == traj), key=lambda i: rows[i][1])
        running = 0.0
        for i in reversed(members):
            running = rows[i][2] + gamma * running
            out[i] = running
    return out


def _ref_segment_returns(rewards, mask, gamma):
    out = torch.zeros(rewards.shape, dtype=F64)
    for b in range(rewards.shape[0]):
        segs, current = [], []
        for t in range(rewards.shape[1]):
            if mask[b, t]:
                current.append(t)
            elif current:
                segs.append(current)
                current = []
        if current:
            segs.append(current)
        running = 0.0
        for seg in reversed(segs):
            running = sum(rewards[b, t].item() for t in seg) + gamma * running
            for t in seg:
                out[b, t] = running
    return out


# ---- reward normalisation --------------------------------------------------------------------------------------

SCORES = [1.0, 0.5, -0.25, 2.0, 1.5, 0.75, 0.75]
GROUPS = [7, 2, 7, 11, 2, 7, 5]  # group 11 and group 5 are singletons


@pytest.mark.parametrize("mean_type", ["batch", "group", None])
@pytest.mark.parametrize("std_type", ["batch", "group", None])
def test_grouped_reward_norm_matches_reference(mean_type, std_type) -> None:
    got = grouped_reward_norm(torch.tensor(SCORES, dtype=F64), torch.tensor(GROUPS), mean_type, std_type)
    assert_close(got, torch.tensor(_ref_norm(SCORES, GROUPS, mean_type, std_type), dtype=F64), **TOL)


def test_grouped_reward_norm_whole_batch_and_constant_group() -> None:
    scores = torch.tensor([1.0, 1.0, 1.0, 3.0], dtype=F64)
    got = grouped_reward_norm(scores, None, "batch", "batch")
    assert_close(got, torch.tensor(_ref_norm(scores.tolist(), [0] * 4, "batch", "batch"), dtype=F64), **TOL)
    # A group whose scores all agree has no spread: every member gets 0, never a division by ~0.
    same = grouped_reward_norm(scores, torch.tensor([0, 0, 0, 1]), "group", "group")
    assert same.tolist() == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("method", "grouping", "expected"),
    [
        ("identity", "traj_group_id", (None, None)),
        ("mean", "batch", ("batch", None)),
        ("mean", "tags", ("group", None)),
        ("mean_std", "traj_group_id", ("group", "group")),
        ("asym_clip", "batch", ("batch", "batch")),
    ],
)
def test_reward_norm_types_follow_roll(method, grouping, expected) -> None:
    assert reward_norm_types(method, grouping) == expected


def test_bad_norm_arguments_name_the_field() -> None:
    with pytest.raises(ConfigError, match="reward_normalization.method"):
        reward_norm_types("zscore", "batch")
    with pytest.raises(ConfigError, match="norm_std_type='global'"):
        grouped_reward_norm(torch.ones(2), None, "batch", "global")


def test_labels_to_index_first_seen_order() -> None:
    assert labels_to_index(["b", "a", "b", ("x", 1), "a"]).tolist() == [0, 1, 0, 2, 1]


# ---- step returns and GiGPO ------------------------------------------------------------------------------------

# (traj, step, reward) in shuffled order; trajectory 9 has a single step, trajectory 4 has steps 0..3.
ROWS = [(4, 2, 0.5), (9, 0, 1.0), (4, 0, -0.1), (3, 1, 2.0), (4, 3, 1.0), (3, 0, 0.0), (4, 1, -0.1)]


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_step_discounted_returns_matches_reference(gamma) -> None:
    got = step_discounted_returns(
        torch.tensor([r[2] for r in ROWS], dtype=F64),
        torch.tensor([r[0] for r in ROWS]),
        torch.tensor([r[1] for r in ROWS]),
        gamma,
    )
    assert_close(got, torch.tensor(_ref_step_returns(ROWS, gamma), dtype=F64), **TOL)


def test_step_discounted_returns_rejects_duplicate_steps() -> None:
    with pytest.raises(ConfigError, match="same step_index"):
        step_discounted_returns(torch.ones(2), torch.tensor([1, 1]), torch.tensor([0, 0]), 0.9)


def test_gigpo_rewards_match_reference() -> None:
    # Two episode groups (seeds) of two episodes each; states are strings as the step-wise manager hashes them.
    episode_group = ["g0", "g0", "g0", "g0", "g0", "g1", "g1", "g1"]
    traj = [0, 0, 0, 1, 1, 2, 2, 3]
    step = [0, 1, 2, 0, 1, 0, 1, 0]
    states = ["s0", "s1", "s2", "s0", "s1", "s0", "s5", "s0"]  # "s0" also occurs in g1: a different state group
    rewards = [0.0, -0.1, 1.0, 0.0, -0.1, 0.0, 0.5, 0.2]
    episode_scores = [0.9, 0.9, 0.9, -0.1, -0.1, 0.5, 0.5, 0.2]
    gamma = 0.95
    returns = step_discounted_returns(torch.tensor(rewards, dtype=F64), torch.tensor(traj), torch.tensor(step), gamma)
    expected_returns = _ref_step_returns(list(zip(traj, step, rewards)), gamma)
    assert_close(returns, torch.tensor(expected_returns, dtype=F64), **TOL)
    groups = labels_to_index(episode_group)
    state_groups = state_group_index(groups, labels_to_index(states))
    # s0 in g0 (rows 0, 3), s1 in g0 (rows 1, 4), s2 in g0 (row 2), s0 in g1 (rows 5, 7), s5 in g1 (row 6).
    assert state_groups.tolist() == [0, 1, 2, 0, 1, 3, 4, 3]
    out = gigpo_rewards(
        torch.tensor(episode_scores, dtype=F64),
        returns,
        groups,
        state_groups,
        episode_reward_weight=1.0,
        step_reward_weight=0.5,
        episode_norm=("group", "group"),
        step_norm=("group", None),
    )
    ref_episode = _ref_norm(episode_scores, episode_group, "group", "group")
    ref_step = _ref_norm(expected_returns, state_groups.tolist(), "group", None)
    assert_close(out.episode, torch.tensor(ref_episode, dtype=F64), **TOL)
    assert_close(out.step, torch.tensor(ref_step, dtype=F64), **TOL)
    assert_close(out.rewards, torch.tensor([e + 0.5 * s for e, s in zip(ref_episode, ref_step)], dtype=F64), **TOL)
    # A singleton state group (row 2, row 6) carries no step-level signal.
    assert out.step[2].item() == 0.0 and out.step[6].item() == 0.0


def test_step_reinforce_is_normalised_returns() -> None:
    returns = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=F64)
    got = step_reinforce_rewards(returns, torch.tensor([0, 0, 1, 1]), "group", "group")
    assert_close(got, torch.tensor(_ref_norm(returns.tolist(), [0, 0, 1, 1], "group", "group"), dtype=F64), **TOL)


# ---- token-level returns ---------------------------------------------------------------------------------------

# Trajectory-wise rows: assistant turns (1) separated by environment tokens (0), then right padding.
TRAJ_MASK = torch.tensor(
    [
        [1, 1, 0, 0, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 0, 1, 0, 1, 1, 0, 0],
    ],
    dtype=torch.bool,
)


def _traj_rewards() -> torch.Tensor:
    rewards = torch.zeros(TRAJ_MASK.shape, dtype=F64)
    rewards[0, 1], rewards[0, 6], rewards[0, 8] = -0.1, 0.2, 1.0  # a reward on each turn's last token
    rewards[1, 2] = 0.5
    rewards[2, 2], rewards[2, 4], rewards[2, 7] = 1.0, 0.3, -1.0
    rewards[2, 6] = 0.25  # a mid-turn reward counts towards its turn
    rewards[~TRAJ_MASK] = 1e6  # garbage outside the mask must not leak
    return rewards


@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_agentic_reinforce_discounts_per_turn(gamma) -> None:
    rewards = _traj_rewards()
    adv, ret = agentic_reinforce_advantages(rewards, TRAJ_MASK, gamma)
    clean = torch.where(TRAJ_MASK, rewards, torch.zeros((), dtype=F64))
    assert_close(adv, _ref_segment_returns(clean, TRAJ_MASK, gamma), **TOL)
    assert_close(ret, adv)
    if gamma == 0.8:  # row 0: turns end with -0.1, 0.2, 1.0
        assert adv[0, 0].item() == pytest.approx(-0.1 + 0.8 * (0.2 + 0.8 * 1.0))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_returns_over_valid_tokens(gamma) -> None:
    rewards = _traj_rewards()
    adv, ret = reinforce_returns(rewards, TRAJ_MASK, gamma)
    expected = torch.zeros(rewards.shape, dtype=F64)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if TRAJ_MASK[b, t]:
                running = rewards[b, t].item() + gamma * running
                expected[b, t] = running
    assert_close(adv, expected, **TOL)
    assert_close(ret, expected, **TOL)


def test_segment_masked_mean_and_gradients() -> None:
    values = torch.arange(30, dtype=F64).reshape(3, 10).requires_grad_(True)
    got = segment_masked_mean(values, TRAJ_MASK)
    expected = torch.zeros(3, 10, dtype=F64)
    for b in range(3):
        t = 0
        while t < 10:
            if TRAJ_MASK[b, t]:
                end = t
                while end < 10 and TRAJ_MASK[b, end]:
                    end += 1
                expected[b, t:end] = values[b, t:end].mean().item()
                t = end
            else:
                t += 1
    assert_close(got.detach(), expected, **TOL)
    got.sum().backward()
    # Each valid token contributes 1/len(segment) to each of the segment's len(segment) outputs: gradient 1.
    assert_close(values.grad, TRAJ_MASK.to(F64))
