"""ROLL's reward normalization, REINFORCE return and sample masks against plain-Python references."""

from __future__ import annotations

import statistics

import pytest
import torch

from roll.pipelines.algorithms.roll_knobs import (
    RunningMoments,
    difficulty_mask,
    error_length_mask,
    normalize_rewards,
    query_filter_mask,
    reinforce_returns,
    sample_loss_weights,
    whiten_token_rewards,
)

SCORES = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 2.0, -1.0, 0.25]
GROUPS = [0, 0, 0, 1, 1, 1, 2, 2, 2]


def _reference_norm(mean_type: str | None, std_type: str | None) -> list[float]:
    by_group = {g: [s for s, gg in zip(SCORES, GROUPS) if gg == g] for g in set(GROUPS)}
    out = []
    for s, g in zip(SCORES, GROUPS):
        mean = {"batch": statistics.mean(SCORES), "group": statistics.mean(by_group[g]), None: 0.0}[mean_type]
        if std_type is None:
            out.append(s - mean)
            continue
        std = statistics.stdev(SCORES) if std_type == "batch" else statistics.stdev(by_group[g])
        out.append((s - mean) / (std + 1e-6))
    return out


@pytest.mark.parametrize("mean_type", ["batch", "group", None])
@pytest.mark.parametrize("std_type", ["batch", "group", None])
def test_normalize_rewards_matches_reference(mean_type, std_type):
    got = normalize_rewards(torch.tensor(SCORES), torch.tensor(GROUPS), mean_type, std_type)
    assert got.tolist() == pytest.approx(_reference_norm(mean_type, std_type), abs=1e-6)


def test_running_needs_its_moments():
    from roll.runtime import ConfigError

    with pytest.raises(ConfigError, match="running"):
        normalize_rewards(torch.tensor(SCORES), torch.tensor(GROUPS), "running", None)


STREAM = [[1.0, 0.0, 0.5, 1.0], [0.0, 0.0, 2.0], [-1.0, 0.25, 0.75, 0.5, 3.0]]


def test_running_moments_equal_the_statistics_of_everything_seen():
    moments = RunningMoments()
    seen: list[float] = []
    for batch in STREAM:
        moments.update(torch.tensor(batch))
        seen += batch
        assert moments.mean == pytest.approx(statistics.mean(seen), abs=1e-9)
        assert moments.std == pytest.approx(statistics.stdev(seen), abs=1e-9)
    restored = RunningMoments()
    restored.load_state_dict(moments.state_dict())
    assert restored.state_dict() == moments.state_dict()


@pytest.mark.parametrize(("mean_type", "std_type"), [("running", "running"), ("running", None), ("batch", "running")])
def test_running_normalization_uses_the_updated_moments(mean_type, std_type):
    moments = RunningMoments()
    moments.update(torch.tensor(STREAM[0]))
    moments.update(torch.tensor(SCORES))  # ROLL updates with the batch, then normalizes it
    seen = STREAM[0] + SCORES
    got = normalize_rewards(torch.tensor(SCORES), torch.tensor(GROUPS), mean_type, std_type, moments)
    mean = statistics.mean(seen) if mean_type == "running" else statistics.mean(SCORES)
    expected = [(s - mean) / ((statistics.stdev(seen) + 1e-6) if std_type else 1.0) for s in SCORES]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_whiten_token_rewards_matches_reference():
    rewards = [[0.0, 0.0, 1.0, 7.0], [0.0, 0.5, 0.0, -2.0], [3.0, 0.0, 0.0, 0.0]]
    mask = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    valid = [r for row, m in zip(rewards, mask) for r, k in zip(row, m) if k]
    mean, var = statistics.mean(valid), statistics.variance(valid)
    expected = [
        [(r - mean) / (var + 1e-8) ** 0.5 if k else 0.0 for r, k in zip(row, m)] for row, m in zip(rewards, mask)
    ]
    got = whiten_token_rewards(torch.tensor(rewards), torch.tensor(mask))
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)
    one = whiten_token_rewards(torch.tensor([[2.0, 5.0]]), torch.tensor([[1, 0]]))
    assert one.tolist() == [[2.0, 0.0]]  # one valid token: no whitening (ROLL turns it off)


def test_reinforce_returns_are_discounted_returns_to_go():
    rewards = torch.tensor([[0.5, 0.0, 1.0, 9.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    gamma = 0.9
    expected = []
    for row, m in zip(rewards.tolist(), mask.tolist()):
        r = [a * b for a, b in zip(row, m)]
        expected.append([sum(r[k] * gamma ** (k - t) for k in range(t, len(r))) * m[t] for t in range(len(r))])
    advantages, returns = reinforce_returns(rewards, mask, gamma)
    assert torch.allclose(advantages, torch.tensor(expected), atol=1e-6)
    assert torch.equal(advantages, returns)


def test_difficulty_mask_keeps_groups_strictly_inside_the_band():
    # group means: 0.5, 0.333.., 0.4167; band (0.4, 0.95) keeps groups 0 and 2
    got = difficulty_mask(torch.tensor(SCORES), torch.tensor(GROUPS), 0.4, 0.95)
    assert got.tolist() == [1, 1, 1, 0, 0, 0, 1, 1, 1]
    edge = difficulty_mask(torch.tensor([0.5, 0.5]), torch.tensor([0, 0]), 0.5, 1.0)
    assert edge.tolist() == [0, 0]  # the bounds are exclusive, as in ROLL


def test_error_length_mask():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.5])
    lengths = torch.tensor([100.0, 10.0, 50.0, 5.0])
    assert error_length_mask(scores, lengths, 20).tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize(
    ("kind", "args", "kept_groups"),
    [
        ("no_filter", {}, [0, 1, 2]),
        ("mean_filter", {"threshold_up": 0.9, "threshold_down": 0.4}, [0, 2]),  # means 0.5, 1/3, 5/12
        ("mean_filter", {"threshold_up": 0.45}, [1, 2]),
        ("mean_filter", {}, [0, 1, 2]),  # ROLL's defaults: up inf, down -1
        ("std_filter", {"std_threshold": 0.5}, [1, 2]),  # stds 0.5, 0.577, 1.52
        ("std_filter", {}, [0, 1, 2]),
    ],
)
def test_query_filter_mask_matches_reference(kind, args, kept_groups):
    scores = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 2.0, -1.0, 0.25]
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    got = query_filter_mask(torch.tensor(scores), torch.tensor(groups), kind, **args)
    assert got.tolist() == [g in kept_groups for g in groups]
    by_group = {g: [s for s, gg in zip(scores, groups) if gg == g] for g in set(groups)}
    if kind == "std_filter" and args:
        assert [statistics.stdev(v) > args["std_threshold"] for v in by_group.values()] == [False, True, True]


def test_query_filter_keeps_groups_of_one():
    got = query_filter_mask(torch.tensor([5.0, 0.0]), torch.tensor([0, 1]), "std_filter", std_threshold=10.0)
    assert got.tolist() == [True, True]


@pytest.mark.parametrize(("use_difficulty", "use_length"), [(True, False), (False, True), (True, True)])
def test_sample_loss_weights_match_reference(use_difficulty, use_length):
    lengths = [3.0, 10.0, 7.0, 5.0]
    difficulty = [0.2, 1.4, -0.1, 0.5]
    raw = []
    for length, d in zip(lengths, difficulty):
        w = 1.0
        if use_difficulty:
            w *= 0.5 + 1.5 * min(max(d, 0.0), 1.0)
        if use_length:
            w *= 1.5 - (length - min(lengths)) / (max(lengths) - min(lengths) + 1e-8)
        raw.append(w)
    expected = [w * len(raw) / (sum(raw) + 1e-8) for w in raw]
    got = sample_loss_weights(
        torch.tensor(lengths), torch.tensor(difficulty), use_difficulty=use_difficulty, use_length=use_length
    )
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_difficulty_weights_need_the_column():
    from roll.runtime import ConfigError

    with pytest.raises(ConfigError, match="difficulty"):
        sample_loss_weights(torch.tensor([1.0, 2.0]), None, use_difficulty=True, use_length=False)
