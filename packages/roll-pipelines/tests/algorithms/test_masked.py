"""Masked reductions against plain-Python references."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms import masked_mean, masked_sum, masked_var, masked_whiten
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}


def _valid_items(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return [x[i, j].item() for i in range(x.shape[0]) for j in range(x.shape[1]) if mask[i, j]]


def _ref_var(items: list[float], ddof: int) -> float:
    mean = sum(items) / len(items)
    return sum((v - mean) ** 2 for v in items) / (len(items) - ddof)


def test_masked_sum_and_mean_match_loops(token_rewards: torch.Tensor, mask: torch.Tensor) -> None:
    items = _valid_items(token_rewards, mask)
    assert_close(masked_sum(token_rewards, mask), torch.tensor(sum(items), dtype=torch.float64), **TOL)
    assert_close(masked_mean(token_rewards, mask), torch.tensor(sum(items) / len(items), dtype=torch.float64), **TOL)
    rows = [[token_rewards[i, j].item() for j in range(5) if mask[i, j]] for i in range(6)]
    assert_close(masked_sum(token_rewards, mask, dim=-1), torch.tensor([sum(r) for r in rows], dtype=torch.float64))
    assert_close(
        masked_mean(token_rewards, mask, dim=1), torch.tensor([sum(r) / len(r) for r in rows], dtype=torch.float64)
    )


def test_float_and_bool_masks_agree(token_rewards: torch.Tensor, mask: torch.Tensor) -> None:
    assert_close(masked_mean(token_rewards, mask.double(), dim=0), masked_mean(token_rewards, mask, dim=0), **TOL)
    assert_close(masked_whiten(token_rewards, mask.float()), masked_whiten(token_rewards, mask), **TOL)


def test_padding_garbage_does_not_leak(mask: torch.Tensor) -> None:
    for garbage in (math.nan, -math.inf):
        x = torch.arange(30, dtype=torch.float64).reshape(6, 5)
        x[~mask] = garbage
        assert torch.isfinite(masked_sum(x, mask))
        assert torch.isfinite(masked_mean(x, mask, dim=-1)).all()
        assert torch.isfinite(masked_whiten(x, mask)).all()


def test_masked_mean_of_empty_slice_is_zero() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, True], [False, False]])
    assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 0.0]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


@pytest.mark.parametrize("unbiased", [True, False])
def test_masked_var_matches_reference(token_rewards: torch.Tensor, mask: torch.Tensor, unbiased: bool) -> None:
    expected = _ref_var(_valid_items(token_rewards, mask), ddof=1 if unbiased else 0)
    assert_close(masked_var(token_rewards, mask, unbiased=unbiased), torch.tensor(expected, dtype=torch.float64), **TOL)


def test_masked_var_degenerate_counts_are_zero() -> None:
    x = torch.tensor([[5.0, 1.0]], dtype=torch.float64)
    assert masked_var(x, torch.tensor([[True, False]])).item() == 0.0
    assert masked_var(x, torch.tensor([[False, False]]), unbiased=False).item() == 0.0


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_reference(token_rewards: torch.Tensor, mask: torch.Tensor, shift_mean: bool) -> None:
    items = _valid_items(token_rewards, mask)
    mean = sum(items) / len(items)
    scale = 1.0 / math.sqrt(_ref_var(items, ddof=1) + 1e-8)
    expected = torch.zeros(6, 5, dtype=torch.float64)
    for i in range(6):
        for j in range(5):
            if mask[i, j]:
                expected[i, j] = (token_rewards[i, j].item() - mean) * scale + (0.0 if shift_mean else mean)
    assert_close(masked_whiten(token_rewards, mask, shift_mean=shift_mean), expected, **TOL)


def test_masked_whiten_is_differentiable(mask: torch.Tensor) -> None:
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: masked_whiten(t, mask), (x,))


def test_mask_shape_mismatch_is_named() -> None:
    with pytest.raises(ConfigError, match=r"mask has shape \(2, 3\); expected \(2, 4\)"):
        masked_sum(torch.zeros(2, 4), torch.ones(2, 3))
