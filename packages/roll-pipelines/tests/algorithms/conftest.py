"""Fixed float64 tensors shared by the algorithm tests.

Six responses of up to five tokens with ragged right padding, and group ids that are unsorted, non-contiguous and
include a group of one: group 7 = rows {0, 2, 5}, group 2 = rows {1, 4}, group 11 = row {3}.
"""

from __future__ import annotations

import pytest
import torch

MASK_ROWS = [
    [1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0],
    [1, 0, 0, 0, 0],
    [1, 1, 1, 1, 0],
    [1, 1, 0, 0, 0],
    [1, 1, 1, 1, 1],
]


@pytest.fixture
def mask() -> torch.Tensor:
    """(6, 5) bool response mask, right-padded, ragged."""
    return torch.tensor(MASK_ROWS, dtype=torch.bool)


@pytest.fixture
def group_index() -> torch.Tensor:
    return torch.tensor([7, 2, 7, 11, 2, 7], dtype=torch.int64)


@pytest.fixture
def scores() -> torch.Tensor:
    return torch.tensor([1.0, 0.5, -0.25, 2.0, 1.5, 0.75], dtype=torch.float64)


def _fixed(seed: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(6, 5, generator=gen, dtype=torch.float64) * scale + offset


@pytest.fixture
def token_rewards() -> torch.Tensor:
    """(6, 5) rewards with large garbage in the padding, which must never leak into results."""
    rewards = _fixed(1)
    rewards[~torch.tensor(MASK_ROWS, dtype=torch.bool)] = 1e6
    return rewards


@pytest.fixture
def values() -> torch.Tensor:
    v = _fixed(2, 0.5)
    v[~torch.tensor(MASK_ROWS, dtype=torch.bool)] = -1e6
    return v


@pytest.fixture
def log_probs_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """(new, old) log-probs whose ratios exp(new - old) spread over roughly [0.5, 2]."""
    old = -_fixed(3, 0.7).abs() - 0.1
    new = old + _fixed(4, 0.35)
    return new, old
