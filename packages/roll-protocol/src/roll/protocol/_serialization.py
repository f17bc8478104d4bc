"""Pickling of tensors with their bytes out of band (pickle protocol 5).

``torch.Tensor``'s own pickling writes the storage in band (a copy into the pickle stream, another on load).
Here a tensor becomes ``(dtype, shape, PickleBuffer)``: with a ``buffer_callback`` (Ray's object store, or
``pickle.dumps(..., protocol=5, buffer_callback=...)``) the bytes never enter the stream.

A buffer that comes back read-only (Ray's shared-memory store) is copied once on load: torch has no read-only
tensors, and an in-place edit would otherwise write into an object other readers share.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch


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
        return tensor.dtype, shape, pickle.PickleBuffer(raw)
    # bytes: one copy here; unpack_tensor makes the one copy a writable tensor needs.
    return tensor.dtype, shape, raw.tobytes()


def unpack_tensor(dtype: torch.dtype, shape: tuple[int, ...], payload: Any) -> torch.Tensor:
    view = memoryview(payload)
    if view.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if view.readonly:
        # numpy's allocator uses huge pages for large buffers: copying into it is ~4x faster than a bytearray.
        owned = np.empty(view.nbytes, dtype=np.uint8)
        owned[:] = np.frombuffer(view, dtype=np.uint8)
        flat = torch.from_numpy(owned)
    else:
        flat = torch.frombuffer(payload, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)
