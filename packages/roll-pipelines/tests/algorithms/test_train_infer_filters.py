"""ROLL's train_infer_correction ratio/diff filters against a plain-Python reference on fixed tensors (1e-6)."""

from __future__ import annotations

import math

import pytest
import torch

from roll.pipelines.algorithms import segment_masked_mean
from roll.pipelines.algorithms.train_infer import RatioDiffFilter, train_infer_filter_mask
from roll.runtime import ConfigError

OLD = [[-0.5, -1.2, -0.3, -2.0, -0.4], [-0.9, -0.1, -1.5, -0.7, -0.2], [-0.2, -0.4, -3.0, -1.1, -0.6]]
INFER = [[-0.6, -0.6, -0.35, -2.1, -0.4], [-0.9, -0.15, -1.2, -0.7, -9.0], [-0.25, -0.45, -2.0, -1.3, -0.6]]
# row 2 has two segments (two assistant turns); row 1's last position is padding with a wild log-prob
MASK = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 0, 1, 1]]


def _segments(row: list[int]) -> list[list[int]]:
    runs, current = [], []
    for t, m in enumerate(row):
        if m:
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def _reference(rule: RatioDiffFilter) -> list[list[float]]:
    """Keep (1) / drop (0) per valid token, 1 off the mask, from the formulas in the module docstring."""
    out = []
    for old, infer, mask in zip(OLD, INFER, MASK):
        d = [o - i if m else 0.0 for o, i, m in zip(old, infer, mask)]
        diff = [math.exp(o) - math.exp(i) if m else 0.0 for o, i, m in zip(old, infer, mask)]
        valid = [t for t, m in enumerate(mask) if m]
        if rule.agg_type == "token":
            ratio_t, diff_t = [math.exp(x) for x in d], diff
        elif rule.agg_type in ("geometric", "sequence"):
            div = len(valid) if rule.agg_type == "geometric" else 1
            r, df = math.exp(sum(d) / div), sum(diff) / div
            ratio_t, diff_t = [r] * len(d), [df] * len(d)
        else:
            ratio_t, diff_t = [0.0] * len(d), [0.0] * len(d)
            for run in _segments(mask):
                r = math.exp(sum(d[t] for t in run) / len(run))
                df = sum(diff[t] for t in run) / len(run)
                for t in run:
                    ratio_t[t], diff_t[t] = r, df
        row = []
        for t, m in enumerate(mask):
            keep = True
            if rule.ratio_enabled:
                keep &= rule.ratio_low <= ratio_t[t] <= rule.ratio_high
            if rule.diff_enabled:
                keep &= rule.diff_low <= diff_t[t] <= rule.diff_high
            row.append(1.0 if (keep or not m) else 0.0)
        out.append(row)
    return out


RULES = [
    RatioDiffFilter(),
    RatioDiffFilter(agg_type="token", ratio_enabled=False, diff_enabled=True, diff_low=-0.05, diff_high=0.05),
    RatioDiffFilter(agg_type="geometric", ratio_low=0.93, ratio_high=1.1),
    RatioDiffFilter(agg_type="sequence", ratio_low=0.75, ratio_high=1.5, diff_enabled=True),
    RatioDiffFilter(agg_type="segment", ratio_low=0.95, ratio_high=1.3),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.agg_type}-{r.ratio_enabled}-{r.diff_enabled}")
def test_each_filter_matches_the_reference(rule: RatioDiffFilter) -> None:
    keep, metrics = train_infer_filter_mask(torch.tensor(OLD), torch.tensor(INFER), torch.tensor(MASK), [rule])
    expected = _reference(rule)
    assert keep.tolist() == expected
    valid = sum(sum(m) for m in MASK)
    dropped = sum(1 for row, m in zip(expected, MASK) for k, v in zip(row, m) if v and not k)
    assert metrics["train_infer_final_mask_mean"] == pytest.approx((valid - dropped) / valid, abs=1e-6)
    assert metrics["train_infer_masked_tokens"] == dropped
    gone = sum(1 for row, m in zip(expected, MASK) if all(not k for k, v in zip(row, m) if v))
    assert metrics["train_infer_masked_sequences"] == gone


def test_filters_multiply_and_report_each_pass_rate() -> None:
    rules = [RULES[0], RULES[2]]
    keep, metrics = train_infer_filter_mask(torch.tensor(OLD), torch.tensor(INFER), torch.tensor(MASK), rules)
    first, second = _reference(rules[0]), _reference(rules[1])
    assert keep.tolist() == [[a * b for a, b in zip(x, y)] for x, y in zip(first, second)]
    valid = sum(sum(m) for m in MASK)
    kept_first = sum(k for row, m in zip(first, MASK) for k, v in zip(row, m) if v)
    assert metrics["train_infer_token_ratio_mask_mean"] == pytest.approx(kept_first / valid, abs=1e-6)
    assert "train_infer_geometric_ratio_mask_mean" in metrics


def test_sequence_levels_drop_whole_responses() -> None:
    keep, metrics = train_infer_filter_mask(torch.tensor(OLD), torch.tensor(INFER), torch.tensor(MASK), [RULES[2]])
    for row, mask in zip(keep.tolist(), MASK):
        assert len({k for k, m in zip(row, mask) if m}) == 1  # all or nothing per response
    assert metrics["train_infer_masked_sequences"] >= 1


def test_segment_mean_is_per_turn() -> None:
    values = torch.tensor([[1.0, 3.0, 100.0, 4.0, 8.0]])
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    assert segment_masked_mean(values, mask).tolist() == [[2.0, 2.0, 0.0, 6.0, 6.0]]


def test_no_filter_keeps_everything_and_bad_bounds_fail() -> None:
    keep, metrics = train_infer_filter_mask(torch.tensor(OLD), torch.tensor(INFER), torch.tensor(MASK), [])
    assert bool((keep == 1).all()) and metrics == {}
    with pytest.raises(ConfigError, match="inverted"):
        RatioDiffFilter(ratio_low=1.5, ratio_high=1.0)
    with pytest.raises(ConfigError, match="agg_type"):
        RatioDiffFilter(agg_type="tokens")  # type: ignore[arg-type]
