"""Reducing per-worker / per-micro-batch metric lists to one number per key."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["reduce_metrics"]

_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "@max": max,
    "@min": min,
    "@sum": sum,
    "@mean": lambda values: sum(values) / len(values),
}


def _numbers(value: Any) -> list[float]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [float(v) for item in value for v in _numbers(item)]
    if isinstance(value, bool | int | float):
        return [float(value)]
    return []


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Lists become their mean; a key ending in ``@max``/``@min``/``@sum``/``@mean`` uses that reduction and
    loses the suffix. Non-numeric values are dropped; NaN stays NaN (so a broken run is visible)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        numbers = _numbers(value)
        if not numbers:
            continue
        name, reducer = key, _REDUCERS["@mean"]
        for suffix, candidate in _REDUCERS.items():
            if key.endswith(suffix):
                name, reducer = key[: -len(suffix)], candidate
                break
        result = reducer(numbers)
        out[name] = float(result) if not math.isnan(result) else float("nan")
    return out
