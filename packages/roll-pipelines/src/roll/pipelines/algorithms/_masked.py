"""Reductions over the valid entries of a tensor.

Masks may be bool, int or float; a non-zero entry marks a valid element. Invalid elements are excluded with
``torch.where`` rather than multiplied by zero, so garbage in padding (``-inf`` log-probs, NaN) never leaks into
a result. All results keep the floating dtype of ``x``.
"""

from __future__ import annotations

import torch

from roll.pipelines.algorithms._validation import as_bool_mask, as_float, check_same_shape

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def _prepare(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_same_shape("x", x, mask=mask)
    return as_float(x), as_bool_mask(mask)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over entries where ``mask`` is set.

    Args:
        x: any shape.
        mask: same shape as ``x``.
        dim: reduce over this dimension only; ``None`` reduces over everything (scalar result).

    Returns:
        A scalar, or ``x``'s shape without ``dim``.
    """
    x, valid = _prepare(x, mask)
    kept = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is set; 0 where there are none (instead of NaN).

    Shapes as :func:`masked_sum`.
    """
    x, valid = _prepare(x, mask)
    total = masked_sum(x, valid, dim=dim)
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    # clamp: an all-invalid slice has total 0 and should average to 0, not 0/0.
    return total / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all entries where ``mask`` is set (scalar).

    ``unbiased`` divides by ``n - 1`` (Bessel's correction, like ``torch.var``). With too few valid entries for
    the estimate (``n <= 1`` unbiased, ``n == 0`` biased) the result is 0, so whitening stays finite.
    """
    x, valid = _prepare(x, mask)
    mean = masked_mean(x, valid)
    sq_dev = masked_sum((x - mean) ** 2, valid)
    n = valid.sum().to(x.dtype)
    denom = n - 1 if unbiased else n
    # With n <= 1 the squared deviations sum to exactly 0, so clamping the divisor yields 0 without a branch.
    return sq_dev / denom.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to unit variance over its valid entries: ``(x - mean) / sqrt(var + eps)``.

    Statistics are taken over all valid entries together (not per row); the variance is unbiased. With
    ``shift_mean=False`` the mean is added back, so only the scale changes.

    Args:
        x: any shape, typically (batch, response_len).
        mask: same shape as ``x``.

    Returns:
        Same shape as ``x``; entries outside the mask are 0.
    """
    x, valid = _prepare(x, mask)
    mean = masked_mean(x, valid)
    var = masked_var(x, valid, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(valid, whitened, torch.zeros((), dtype=x.dtype, device=x.device))
