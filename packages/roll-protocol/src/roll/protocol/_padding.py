"""Padding a DataProto to a multiple of a divisor, and removing the padding again."""

from __future__ import annotations

import numpy as np

from roll.protocol._dataproto import DataProto
from roll.protocol.errors import ProtocolError


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of leading rows (cycling if needed) until ``len`` is a multiple of ``size_divisor``.

    Returns ``(padded, pad_size)``; :func:`unpad_dataproto` with the same ``pad_size`` undoes it. Dispatch never
    pads (uneven DP chunks are allowed); this is for code that needs equal shapes, e.g. a static-shape kernel.
    """
    if size_divisor < 1:
        raise ProtocolError(f"size_divisor must be >= 1, got {size_divisor}")
    pad_size = (-len(data)) % size_divisor
    if pad_size == 0:
        return data, 0
    if len(data) == 0:
        raise ProtocolError("cannot pad an empty DataProto: there is no row to copy")
    padding = data.select_idxs(np.arange(pad_size) % len(data))
    return DataProto.concat([data, padding]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows (a view)."""
    if pad_size < 0 or pad_size > len(data):
        raise ProtocolError(f"pad_size {pad_size} is outside [0, {len(data)}]")
    return data.slice(0, len(data) - pad_size) if pad_size else data
