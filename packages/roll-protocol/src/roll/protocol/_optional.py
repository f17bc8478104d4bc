"""torch and tensordict are optional: the tensor section of roll.protocol comes with ``roll-protocol[torch]``.

Nothing here imports torch. A value can only be a tensor if some code already imported torch, so checks look in
``sys.modules`` (a dict lookup) instead of importing it; :func:`tensors` imports the tensor helpers on first real
use of a tensor feature, or says which extra to install.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, TypeGuard

from roll.protocol.errors import MissingExtraError

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

__all__ = ["has_tensor_extra", "is_tensor", "is_tensordict", "tensors"]

_tensors: ModuleType | None = None


def is_tensor(value: object) -> TypeGuard[torch.Tensor]:
    """``isinstance(value, torch.Tensor)``, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_tensordict(value: object) -> TypeGuard[TensorDict]:
    """``isinstance(value, tensordict.TensorDict)``, without importing tensordict."""
    module = sys.modules.get("tensordict")
    return module is not None and isinstance(value, module.TensorDict)


def has_tensor_extra() -> bool:
    """Whether torch and tensordict can be imported (imports them if so)."""
    try:
        tensors("")
    except MissingExtraError:
        return False
    return True


def tensors(feature: str) -> ModuleType:
    """``roll.protocol._tensors`` (torch, tensordict and roll's tensor helpers), imported on first use.

    Raises :class:`MissingExtraError` naming ``feature`` and ``pip install 'roll-protocol[torch]'`` when torch or
    tensordict is not installed.
    """
    global _tensors
    if _tensors is None:
        try:
            from roll.protocol import _tensors as module
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in ("torch", "tensordict"):
                raise
            raise MissingExtraError(
                feature or "tensors in a DataProto", "roll-protocol", "torch", cause=f"no module named {e.name!r}"
            ) from e
        _tensors = module
    return _tensors
