"""The data error type and the helpers that make every data error name its file, row and fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from roll.runtime.errors import RollError

__all__ = ["DataError", "describe_keys", "row_location"]


class DataError(RollError, ValueError):
    """A dataset is unusable as configured.

    The message names the file (or ``synthetic://`` URI), the 0-based row and, where one is involved, the key,
    and says how to fix it, e.g. ``"train.jsonl row 17: missing key 'response' (keys: prompt, answer); set
    data_args.response_key or fix the row"``.
    """

    exit_code: ClassVar[int] = 2


def row_location(source: str, index: int | None) -> str:
    """``"train.jsonl row 17"``, or just the source when the row is unknown."""
    return source if index is None else f"{source} row {index}"


def describe_keys(row: Mapping[str, Any], limit: int = 12) -> str:
    """The keys of a row for an error message, shortened for very wide rows."""
    keys = [str(k) for k in row]
    if len(keys) > limit:
        return ", ".join(keys[:limit]) + f", ... ({len(keys)} keys)"
    return ", ".join(keys) if keys else "none"
