"""The tensor section of a DataProto: torch and tensordict (the ``roll-protocol[torch]`` extra) live here.

Imported through :func:`roll.protocol._optional.tensors` the first time a tensor is involved, so a process that
only moves non-tensor columns never imports torch.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from roll.protocol._serialization import pack_tensor, unpack_tensor
from roll.protocol._tensor_ops import cat_rows_many, take_rows
from roll.protocol.errors import ProtocolError

__all__ = [
    "TensorDict",
    "cat_rows_many",
    "pack_tensor",
    "take_rows",
    "tensordict_from",
    "tensordict_unchecked",
    "tensors_equal",
    "torch",
    "unpack_tensor",
]

_NEW_UNSAFE = getattr(TensorDict, "_new_unsafe", None)


def tensordict_unchecked(tensors: dict[str, torch.Tensor], length: int, device: Any) -> TensorDict:
    """A TensorDict of tensors known to have ``length`` rows. tensordict's private constructor skips the checks that
    make building many small parts slow; versions without it get the public one."""
    if _NEW_UNSAFE is not None:
        result: TensorDict = _NEW_UNSAFE(tensors, batch_size=torch.Size([length]), device=device)
        return result
    return TensorDict(tensors, batch_size=[length], device=device)


def tensordict_from(tensors: dict[str, Any]) -> TensorDict:
    """A TensorDict from tensors with one common leading (batch) dimension; names the offending key otherwise."""
    if not tensors:
        return TensorDict({}, batch_size=[0])
    lengths = {}
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ProtocolError(f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() == 0:
            raise ProtocolError(f"batch[{key!r}] is a scalar tensor; tensors need a leading batch dimension")
        lengths[key] = value.shape[0]
    first_key = next(iter(lengths))
    for key, n in lengths.items():
        if n != lengths[first_key]:
            raise ProtocolError(
                f"tensor {key!r} has {n} rows but {first_key!r} has {lengths[first_key]}; all tensors need the same "
                f"leading (batch) dimension"
            )
    return TensorDict(tensors, batch_size=[lengths[first_key]])


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
