"""Per-group statistics for samples identified by arbitrary group ids.

Group ids (one int per sample, e.g. the prompt index) need not be contiguous, sorted or start at 0: they are
mapped to dense indices with ``torch.unique`` and reduced with ``index_add``, so no Python loop runs over rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.pipelines.algorithms._validation import as_float, check_1d
from roll.runtime.errors import ConfigError

__all__ = ["GroupStats", "group_stats"]


@dataclass(frozen=True)
class GroupStats:
    """Statistics of each sample's group, gathered back per sample; every field is (batch,)."""

    mean: torch.Tensor
    """Mean of the values in the sample's group."""
    std: torch.Tensor
    """Unbiased standard deviation of the group (``torch.std`` default); 0 for groups of size 1."""
    count: torch.Tensor
    """Number of samples in the group, in the values' float dtype."""
    sum: torch.Tensor
    """Sum of the values in the group."""


def _dense_ids(group_index: torch.Tensor, batch: int) -> tuple[torch.Tensor, int]:
    if not isinstance(group_index, torch.Tensor):
        group_index = torch.as_tensor(group_index)
    check_1d("group_index", group_index, batch)
    if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
        raise ConfigError(f"group_index has dtype {group_index.dtype}; expected an integer tensor (e.g. torch.int64)")
    uniq, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(uniq.numel())


def group_stats(values: torch.Tensor, group_index: torch.Tensor) -> GroupStats:
    """Mean, unbiased std, size and sum of each sample's group.

    Args:
        values: (batch,) float.
        group_index: (batch,) integer group id per sample, in any order.

    Returns:
        :class:`GroupStats` with (batch,) fields aligned with ``values``.
    """
    check_1d("values", values)
    values = as_float(values)
    inverse, n_groups = _dense_ids(group_index, values.shape[0])
    inverse = inverse.to(values.device)
    zeros = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    sums = zeros.index_add(0, inverse, values)
    counts = zeros.index_add(0, inverse, torch.ones_like(values))
    means = sums / counts
    # Two-pass variance (deviations from the group mean) is more accurate than E[x^2] - E[x]^2.
    sq_dev = zeros.index_add(0, inverse, (values - means[inverse]) ** 2)
    # A singleton's squared deviation is exactly 0, so clamping the divisor gives std 0 rather than NaN.
    stds = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))
    return GroupStats(mean=means[inverse], std=stds[inverse], count=counts[inverse], sum=sums[inverse])
