"""Reward shaping against plain-Python references."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms import (
    clip_rewards,
    clip_rewards_counted,
    normalize_scores,
    overlong_mask,
    overlong_penalty,
    token_level_rewards_from_scores,
    zero_variance_group_mask,
)
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}
F64 = torch.float64


def _ref_normalize(scores: list[float], groups: list[int], use_std: bool, eps: float) -> list[float]:
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
        mean = sum(members) / len(members)
        std = statistics.stdev(members) if len(members) > 1 else 1.0
        out.append((s - mean) / (std + eps) if use_std else s - mean)
    return out


def test_clip_rewards() -> None:
    scores = torch.tensor([-3.0, -0.5, 0.0, 2.5, 7.0], dtype=F64)
    assert_close(clip_rewards(scores, 2.0), torch.tensor([-2.0, -0.5, 0.0, 2.0, 2.0], dtype=F64))
    assert_close(clip_rewards(scores, None), scores)
    with pytest.raises(ConfigError, match="clip=0"):
        clip_rewards(scores, 0)


def test_clip_rewards_counted_counts_real_entries_only() -> None:
    rewards = torch.tensor([[3.0, 0.2, 0.0, 0.0], [-0.1, -4.0, 5.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    metrics: dict[str, float] = {}
    clipped = clip_rewards_counted(rewards, 1.0, metrics, "frac", mask)
    assert_close(clipped, rewards.clamp(-1.0, 1.0))
    assert metrics["frac"] == pytest.approx(3 / 5)  # of the 5 real tokens 3 are beyond 1; padding does not count
    clip_rewards_counted(rewards, 1.0, metrics, "all")
    assert metrics["all"] == pytest.approx(3 / 8)  # without a mask every entry counts
    untouched: dict[str, float] = {}
    assert_close(clip_rewards_counted(rewards, None, untouched, "frac", mask), rewards)
    assert untouched == {}  # no clip, no metric
    clip_rewards_counted(rewards, 1.0, metrics, "none", torch.zeros(2, 4))
    assert metrics["none"] == 0.0
    with pytest.raises(ConfigError, match="mask has shape"):
        clip_rewards_counted(rewards, 1.0, metrics, "frac", mask[:, :3])


@pytest.mark.parametrize("use_std", [True, False])
def test_normalize_group(scores: torch.Tensor, group_index: torch.Tensor, use_std: bool) -> None:
    expected = _ref_normalize(scores.tolist(), group_index.tolist(), use_std, 1e-6)
    got = normalize_scores(scores, group_index, "group", use_std=use_std)
    assert_close(got, torch.tensor(expected, dtype=F64), **TOL)
    assert got[3] == 0.0  # the lone member of group 11


@pytest.mark.parametrize("use_std", [True, False])
def test_normalize_batch(scores: torch.Tensor, use_std: bool) -> None:
    expected = _ref_normalize(scores.tolist(), [0] * 6, use_std, 1e-6)
    assert_close(normalize_scores(scores, None, "batch", use_std=use_std), torch.tensor(expected, dtype=F64), **TOL)
    assert normalize_scores(scores[:1], None, "batch").item() == 0.0


def test_normalize_none_and_errors(scores: torch.Tensor, group_index: torch.Tensor) -> None:
    assert_close(normalize_scores(scores, group_index, "none"), scores)
    with pytest.raises(ConfigError, match=r"mode='prompt'.*\['batch', 'group', 'none'\]"):
        normalize_scores(scores, group_index, "prompt")
    with pytest.raises(ConfigError, match="group_index=None"):
        normalize_scores(scores, None, "group")
    with pytest.raises(ConfigError, match=r"group_index has shape \(5,\); expected \(6,\)"):
        normalize_scores(scores, group_index[:5], "group")
    with pytest.raises(ConfigError, match=r"group_index has dtype torch\.float32"):
        normalize_scores(scores, group_index.float(), "group")


def test_token_level_rewards_from_scores(scores: torch.Tensor, mask: torch.Tensor) -> None:
    kl = torch.arange(30, dtype=F64).reshape(6, 5) / 10
    kl_coef = 0.3
    expected = torch.zeros(6, 5, dtype=F64)
    for i in range(6):
        valid = [j for j in range(5) if mask[i, j]]
        for j in valid:
            expected[i, j] = -kl_coef * kl[i, j].item()
        expected[i, valid[-1]] += scores[i].item()
    assert_close(token_level_rewards_from_scores(scores, mask, kl=kl, kl_coef=kl_coef), expected, **TOL)
    no_kl = token_level_rewards_from_scores(scores, mask.float())
    assert_close(no_kl.sum(dim=-1), scores)
    assert no_kl[2, 0] == scores[2] and no_kl[1, 2] == scores[1]


def test_token_level_rewards_rejects_empty_rows(scores: torch.Tensor, mask: torch.Tensor) -> None:
    mask = mask.clone()
    mask[1] = False
    mask[4] = False
    with pytest.raises(ConfigError, match=r"no valid token in row\(s\) \[1, 4\]"):
        token_level_rewards_from_scores(scores, mask)
    with pytest.raises(ConfigError, match=r"kl has shape \(6, 4\)"):
        token_level_rewards_from_scores(scores, torch.ones(6, 5), kl=torch.zeros(6, 4), kl_coef=0.1)


def test_zero_variance_group_mask() -> None:
    scores = torch.tensor([1.0, 0.0, 1.0, 3.0, 0.0, 1.0, 2.0], dtype=F64)
    groups = torch.tensor([40, 5, 40, 9, 5, 40, 5])
    # group 40: all 1.0 -> dropped; group 5: {0, 0, 2} varies -> kept; group 9: single sample -> dropped.
    expected = torch.tensor([False, True, False, False, True, False, True])
    assert torch.equal(zero_variance_group_mask(scores, groups), expected)


def test_overlong_penalty_hand_values() -> None:
    lengths = torch.tensor([10, 16, 17, 18, 19, 20, 25])
    # max 20, buffer 4: the ramp starts after 16 and reaches -penalty_factor (here 1.0) at 20.
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0])
    assert_close(overlong_penalty(lengths, 20, 4, 1.0), expected, **TOL)
    assert_close(overlong_penalty(lengths.double(), 20, 4, 0.5), expected.double() * 0.5, **TOL)


def test_overlong_penalty_matches_reference() -> None:
    lengths = list(range(0, 40, 3))
    max_len, buffer, factor = 30, 8, 1.5
    expected = [min(max(-(n - (max_len - buffer)) / buffer * factor, -factor), 0.0) for n in lengths]
    got = overlong_penalty(torch.tensor(lengths, dtype=F64), max_len, buffer, factor)
    assert_close(got, torch.tensor(expected, dtype=F64), **TOL)


def test_overlong_mask_and_errors() -> None:
    lengths = torch.tensor([5, 19, 20, 21])
    assert torch.equal(overlong_mask(lengths, 20), torch.tensor([True, True, False, False]))
    with pytest.raises(ConfigError, match="buffer_length=30"):
        overlong_penalty(lengths, 20, 30, 1.0)
    with pytest.raises(ConfigError, match="max_response_length=0"):
        overlong_mask(lengths, 0)
    with pytest.raises(ConfigError, match="penalty_factor=-1"):
        overlong_penalty(lengths, 20, 4, -1.0)
