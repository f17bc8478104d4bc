"""Argument checks shared by the algorithm functions.

Every check raises :class:`roll.runtime.errors.ConfigError` naming the argument, the bad value and what is
accepted, so a misconfigured run fails at the first call with a message that says how to fix it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import torch

from roll.runtime.errors import ConfigError

__all__ = [
    "as_bool_mask",
    "as_float",
    "check_1d",
    "check_2d",
    "check_choice",
    "check_positive",
    "check_same_shape",
    "check_shape",
]


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise raise ConfigError listing them."""
    valid = list(choices)
    if not isinstance(value, str) or value not in valid:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {sorted(valid)}")
    return value


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    """Raise ConfigError unless ``value`` is a finite number > 0 (or >= 0 with ``allow_zero``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name}={value!r} is not valid; it must be a finite number {bound}")
    return float(value)


def check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...] | torch.Size, *, expected: str) -> None:
    """Raise ConfigError if ``tensor.shape != shape``; ``expected`` describes the shape in words."""
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != tuple(shape):
        raise ConfigError(f"{name} has shape {tuple(tensor.shape)}; expected {tuple(shape)} ({expected})")


def check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Raise ConfigError if any of ``others`` (``None`` entries are skipped) differs in shape from ``ref``."""
    if not isinstance(ref, torch.Tensor):
        raise ConfigError(f"{ref_name} must be a torch.Tensor, got {type(ref).__name__}")
    for name, tensor in others.items():
        if tensor is not None:
            check_shape(name, tensor, ref.shape, expected=f"the shape of {ref_name}")


def check_2d(name: str, tensor: torch.Tensor) -> None:
    """Raise ConfigError unless ``tensor`` is a (batch, response_len) tensor."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ConfigError(f"{name} has shape {shape}; expected a 2-D (batch, response_len) tensor")


def check_1d(name: str, tensor: torch.Tensor, length: int | None = None) -> None:
    """Raise ConfigError unless ``tensor`` is a 1-D (batch,) tensor, of ``length`` elements when given."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ConfigError(f"{name} has shape {shape}; expected a 1-D (batch,) tensor")
    if length is not None and tensor.shape[0] != length:
        raise ConfigError(f"{name} has shape {tuple(tensor.shape)}; expected ({length},) (one entry per sample)")


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """Convert a bool/int/float mask to bool: non-zero entries are valid tokens."""
    return mask if mask.dtype == torch.bool else mask != 0


def as_float(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` unchanged if floating point, else converted to the default float dtype."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())
