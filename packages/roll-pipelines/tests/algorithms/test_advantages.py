"""Advantage estimators against plain-Python references on ragged masks and unsorted groups."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from roll.pipelines.algorithms import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
    whiten_and_clip_advantages,
)
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}
F64 = torch.float64


# ---- plain-Python references ------------------------------------------------------------------------------------


def _valid_cols(mask: torch.Tensor, i: int) -> list[int]:
    return [j for j in range(mask.shape[1]) if mask[i, j]]


def _ref_gae(rewards, values, mask, gamma, lam):
    adv = torch.zeros(rewards.shape, dtype=F64)
    for i in range(rewards.shape[0]):
        cols = _valid_cols(mask, i)  # the recursion runs over the valid subsequence only
        running, next_v = 0.0, 0.0
        for j in reversed(cols):
            delta = rewards[i, j].item() + gamma * next_v - values[i, j].item()
            running = delta + gamma * lam * running
            adv[i, j] = running
            next_v = values[i, j].item()
    returns = torch.where(mask, adv + values, torch.zeros((), dtype=F64))
    return adv, returns


def _ref_whiten(x, mask):
    items = [x[i, j].item() for i in range(x.shape[0]) for j in _valid_cols(mask, i)]
    mean, var = statistics.fmean(items), statistics.variance(items)
    out = torch.zeros(x.shape, dtype=F64)
    for i in range(x.shape[0]):
        for j in _valid_cols(mask, i):
            out[i, j] = (x[i, j].item() - mean) / math.sqrt(var + 1e-8)
    return out


def _broadcast_rows(per_row: list[float], mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(mask.shape, dtype=F64)
    for i, value in enumerate(per_row):
        for j in _valid_cols(mask, i):
            out[i, j] = value
    return out


def _members(values: list[float], groups: list[int], i: int) -> list[float]:
    return [values[k] for k in range(len(values)) if groups[k] == groups[i]]


# ---- GAE --------------------------------------------------------------------------------------------------------


def test_gae_hand_computed_2x3() -> None:
    # gamma = lam = 0.5, so gamma * lam = 0.25.
    # Row 0, all valid, r = [1, 0, 2], V = [0.5, 1, 1.5]:
    #   t=2: delta = 2 + 0.5*0 - 1.5 = 0.5                 A2 = 0.5
    #   t=1: delta = 0 + 0.5*1.5 - 1 = -0.25               A1 = -0.25 + 0.25*0.5 = -0.125
    #   t=0: delta = 1 + 0.5*1 - 0.5 = 1.0                 A0 = 1.0 + 0.25*(-0.125) = 0.96875
    #   returns = A + V = [1.46875, 0.875, 2.0]
    # Row 1, last token is padding with garbage r = 99, V = 99 that must be ignored; r = [0, 3], V = [2, 1]:
    #   t=1: delta = 3 + 0 - 1 = 2 (bootstrap 0 after the last valid token)   A1 = 2
    #   t=0: delta = 0 + 0.5*1 - 2 = -1.5                                      A0 = -1.5 + 0.25*2 = -1.0
    #   returns = [1.0, 3.0, 0]
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 99.0]], dtype=F64)
    values = torch.tensor([[0.5, 1.0, 1.5], [2.0, 1.0, 99.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    assert_close(adv, torch.tensor([[0.96875, -0.125, 0.5], [-1.0, 2.0, 0.0]], dtype=F64), **TOL)
    assert_close(ret, torch.tensor([[1.46875, 0.875, 2.0], [1.0, 3.0, 0.0]], dtype=F64), **TOL)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.7)])
def test_gae_matches_reference(token_rewards, values, mask, gamma: float, lam: float) -> None:
    adv, ret = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = _ref_gae(token_rewards, values, mask, gamma, lam)
    assert_close(adv, ref_adv, **TOL)
    assert_close(ret, ref_ret, **TOL)


def test_gae_skips_interior_masked_tokens(token_rewards, values) -> None:
    # Multi-turn masks have holes (environment tokens); GAE chains the valid tokens across them.
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [1] * 5])
    mask = mask.bool()
    adv, ret = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.8)
    ref_adv, ref_ret = _ref_gae(token_rewards, values, mask, 0.9, 0.8)
    assert_close(adv, ref_adv, **TOL)
    assert_close(ret, ref_ret, **TOL)


def test_gae_runs_without_grad_and_validates(token_rewards, values, mask) -> None:
    adv, ret = gae_advantages(token_rewards, values.clone().requires_grad_(), mask, 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ConfigError, match=r"values has shape \(6, 4\)"):
        gae_advantages(token_rewards, values[:, :4], mask, 1.0, 0.95)
    with pytest.raises(ConfigError, match=r"lam=1\.5"):
        gae_advantages(token_rewards, values, mask, 1.0, 1.5)


# ---- group estimators --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_reference(scores, mask, group_index, norm_by_std: bool) -> None:
    s, g = scores.tolist(), group_index.tolist()
    per_row = []
    for i in range(6):
        members = _members(s, g, i)
        if len(members) == 1:
            per_row.append(0.0)
            continue
        centred = s[i] - statistics.fmean(members)
        per_row.append(centred / (statistics.stdev(members) + 1e-6) if norm_by_std else centred)
    adv, ret = grpo_advantages(scores, mask, group_index, norm_by_std=norm_by_std)
    assert_close(adv, _broadcast_rows(per_row, mask), **TOL)
    assert_close(ret, adv, **TOL)


def test_rloo_matches_reference(scores, mask, group_index) -> None:
    s, g = scores.tolist(), group_index.tolist()
    per_row = []
    for i in range(6):
        others = [s[k] for k in range(6) if g[k] == g[i] and k != i]
        per_row.append(s[i] - statistics.fmean(others) if others else 0.0)
    adv, ret = rloo_advantages(scores, mask, group_index)
    assert_close(adv, _broadcast_rows(per_row, mask), **TOL)
    assert_close(ret, adv, **TOL)
    # Hand check, group 2 = rows {1, 4} with scores 0.5 and 1.5: each is the other's baseline.
    assert adv[1, 0].item() == pytest.approx(-1.0) and adv[4, 0].item() == pytest.approx(1.0)


def test_reinforce_plus_plus_matches_reference(token_rewards, mask) -> None:
    gamma = 0.9
    returns = torch.zeros(6, 5, dtype=F64)
    for i in range(6):
        running = 0.0
        for j in reversed(_valid_cols(mask, i)):
            running = token_rewards[i, j].item() + gamma * running
            returns[i, j] = running
    adv, ret = reinforce_plus_plus_advantages(token_rewards, mask, gamma=gamma)
    assert_close(ret, returns, **TOL)
    assert_close(adv, _ref_whiten(returns, mask), **TOL)


def test_reinforce_plus_plus_baseline_matches_reference(scores, mask, group_index) -> None:
    s, g = scores.tolist(), group_index.tolist()
    centred = [s[i] - statistics.fmean(_members(s, g, i)) for i in range(6)]
    adv, ret = reinforce_plus_plus_baseline_advantages(scores, mask, group_index)
    assert_close(adv, _ref_whiten(_broadcast_rows(centred, mask), mask), **TOL)
    assert_close(ret, adv, **TOL)


def test_group_order_does_not_matter(scores, mask, group_index) -> None:
    perm = torch.tensor([4, 0, 5, 2, 3, 1])
    for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        adv, _ = compute_advantages(name, scores=scores, response_mask=mask, group_index=group_index)
        permuted, _ = compute_advantages(
            name, scores=scores[perm], response_mask=mask[perm], group_index=group_index[perm]
        )
        assert_close(permuted, adv[perm], **TOL)


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(min_value=-3, max_value=3), st.floats(min_value=-5, max_value=5, allow_nan=False)),
        min_size=1,
        max_size=24,
    )
)
def test_grpo_property_group_means_are_zero(data: list[tuple[int, float]]) -> None:
    groups = torch.tensor([g for g, _ in data])
    scores = torch.tensor([s for _, s in data], dtype=F64)
    mask = torch.ones(len(data), 3, dtype=torch.bool)
    adv, _ = grpo_advantages(scores, mask, groups)
    for gid in groups.unique():
        members = adv[groups == gid, 0]
        assert abs(members.mean().item()) < 1e-6
        if members.numel() > 1 and scores[groups == gid].std() > 1e-2:
            assert members.std().item() == pytest.approx(1.0, abs=1e-3)


# ---- registry and post-processing -------------------------------------------------------------------------------


def test_registry_dispatch(token_rewards, values, scores, mask, group_index) -> None:
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}
    direct = gae_advantages(token_rewards, values, mask, 0.99, 0.95)
    via = compute_advantages(
        "gae", token_level_rewards=token_rewards, values=values, response_mask=mask, gamma=0.99, lam=0.95
    )
    assert_close(via, direct)
    rloo = compute_advantages("rloo", scores=scores, response_mask=mask, group_index=group_index)
    assert_close(rloo, rloo_advantages(scores, mask, group_index))


def test_registry_errors(scores, mask) -> None:
    with pytest.raises(ConfigError, match=r"adv_estimator='ppo'.*'gae'.*'grpo'.*'reinforce_plus_plus'.*'rloo'"):
        compute_advantages("ppo", scores=scores, response_mask=mask)
    with pytest.raises(ConfigError, match=r"adv_estimator='grpo' cannot be called.*group_index"):
        compute_advantages("grpo", scores=scores, response_mask=mask)


def test_whiten_and_clip(token_rewards, mask) -> None:
    expected = _ref_whiten(token_rewards, mask).clamp(-1.0, 1.0)
    assert_close(whiten_and_clip_advantages(token_rewards, mask, whiten=True, clip=1.0), expected, **TOL)
    plain = torch.where(mask, token_rewards, torch.zeros((), dtype=F64))
    assert_close(whiten_and_clip_advantages(token_rewards, mask, whiten=False, clip=None), plain)
    with pytest.raises(ConfigError, match="clip=-1"):
        whiten_and_clip_advantages(token_rewards, mask, whiten=False, clip=-1)


def test_advantage_clip_frac_counts_valid_tokens_the_clamp_changed(token_rewards, mask) -> None:
    metrics: dict[str, float] = {}
    whitened = _ref_whiten(token_rewards, mask)
    whiten_and_clip_advantages(token_rewards, mask, whiten=True, clip=1.0, metrics=metrics)
    expected = float((whitened.abs() > 1.0)[mask].double().mean())
    assert 0.0 < expected < 1.0
    assert metrics["critic/advantage_clip_frac"] == pytest.approx(expected)
    whiten_and_clip_advantages(token_rewards, mask, whiten=True, clip=None, metrics=(unclipped := {}))
    assert unclipped == {}  # no clip, no metric


def test_shape_errors_and_dtype_preservation(scores, mask, group_index, token_rewards, values) -> None:
    with pytest.raises(ConfigError, match=r"scores has shape \(5,\); expected \(6,\)"):
        grpo_advantages(scores[:5], mask, group_index)
    with pytest.raises(ConfigError, match=r"response_mask has shape \(6,\); expected a 2-D"):
        rloo_advantages(scores, mask[:, 0], group_index)
    adv, _ = grpo_advantages(scores.float(), mask, group_index)
    assert adv.dtype == torch.float32
    adv, ret = gae_advantages(token_rewards.float(), values.float(), mask.float(), 1.0, 0.95)
    assert adv.dtype == ret.dtype == torch.float32
