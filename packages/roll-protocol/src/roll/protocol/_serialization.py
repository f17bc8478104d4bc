"""Pickling of tensors with their bytes out of band (pickle protocol 5).

``torch.Tensor``'s own pickling writes the storage in band (a copy into the pickle stream, another on load).
Here a tensor becomes ``(dtype, shape, PickleBuffer)``: with a ``buffer_callback`` (Ray's object store, or
``pickle.dumps(..., protocol=5, buffer_callback=...)``) the bytes never enter the stream.

A buffer that comes back read-only (Ray's shared-memory store) is copied once on load: torch has no read-only
tensors, and an in-place edit would otherwise write into an object other readers share. The copy lands in memory
recycled from batches this process has freed (see ``_tensor_ops.BufferCache``), shared among torch's threads.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

from roll.protocol._tensor_ops import buffer_cache, copy_arrays


def pack_tensor(tensor: torch.Tensor, protocol: int) -> tuple[torch.dtype, tuple[int, ...], Any]:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    shape = tuple(tensor.shape)
    if tensor.numel() == 0:
        return tensor.dtype, shape, b""
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    if protocol >= 5:
        return tensor.dtype, shape, pickle.PickleBuffer(raw)  # type: ignore[arg-type]  # numpy declares the buffer protocol for 3.12+ only
    # bytes: one copy here; unpack_tensor makes the one copy a writable tensor needs.
    return tensor.dtype, shape, raw.tobytes()


def unpack_tensor(dtype: torch.dtype, shape: tuple[int, ...], payload: Any) -> torch.Tensor:
    view = memoryview(payload)
    if view.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if view.readonly:
        owned = buffer_cache().empty((view.nbytes,), np.uint8)
        copy_arrays([(owned, np.frombuffer(view, dtype=np.uint8))])
        flat = torch.from_numpy(owned)
    else:
        flat = torch.frombuffer(payload, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)
