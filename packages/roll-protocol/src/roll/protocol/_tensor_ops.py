"""Row gathers and concatenation of CPU tensors through numpy.

numpy allocates large outputs with transparent huge pages (madvise), so filling a fresh 256 MiB buffer takes
~100 page faults instead of ~65,000; and its single-threaded copies do not degrade when the machine's cores are
busy. Measured on a 2-core VM: concatenating 256 MiB took 88 ms with numpy vs 618 ms with ``torch.cat``. Tensors
that numpy cannot view (non-CPU, non-contiguous, or requiring grad) use torch.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["cat_rows", "take_rows"]

# numpy has no bfloat16/float8: view such tensors as same-size integers and back.
_VIEW_AS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


def _numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    if tensor.device.type != "cpu" or tensor.requires_grad or not tensor.is_contiguous() or tensor.dim() == 0:
        return None
    try:
        return tensor.view(_VIEW_AS.get(tensor.dtype, tensor.dtype)).numpy()
    except (TypeError, RuntimeError):
        return None


def _back(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(array).view(dtype)


def cat_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(tensors)`` along dim 0."""
    arrays = [_numpy_view(t) for t in tensors]
    if any(a is None for a in arrays) or len({t.dtype for t in tensors}) != 1:
        return torch.cat(tensors)
    return _back(np.concatenate(arrays, axis=0), tensors[0].dtype)


def take_rows(tensor: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """``tensor.index_select(0, index)``."""
    array = _numpy_view(tensor)
    if array is None:
        return tensor.index_select(0, torch.from_numpy(index).to(tensor.device))
    return _back(np.take(array, index, axis=0), tensor.dtype)
