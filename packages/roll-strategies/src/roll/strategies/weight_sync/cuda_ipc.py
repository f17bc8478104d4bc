"""Bucket slots in GPU memory, shared with engines on the same GPU through CUDA IPC handles.

The owner allocates the slots once per channel and exports one handle per slot; a colocated receiver opens them
once and builds its per-bucket views over them, so a bucket is written once on the device and every colocated
engine loads it from there. Handles name the GPU by the owner's device index, which differs between processes
with different ``CUDA_VISIBLE_DEVICES``; the receiver maps them on its own index of the same physical GPU (UUID).
"""

from __future__ import annotations

from typing import Any

import torch

from roll.strategies.base import StrategyError

__all__ = ["device_uuid", "export_slots", "import_slots"]

_DEVICE_ARG = 6  # position of the device index in torch's rebuild_cuda_tensor arguments


def device_uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


def export_slots(slots: list[torch.Tensor]) -> list[tuple[Any, ...]]:
    """Picklable IPC handles of CUDA tensors (the owner must keep the tensors alive while receivers use them)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return [tuple(reduce_tensor(slot)[1]) for slot in slots]


def import_slots(handles: list[tuple[Any, ...]], gpu: str) -> list[torch.Tensor]:
    """Open ``handles`` on this process's device whose UUID is ``gpu``."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    index = next(
        (i for i in range(torch.cuda.device_count()) if str(torch.cuda.get_device_properties(i).uuid) == gpu), None
    )
    if index is None:
        raise StrategyError(f"GPU {gpu} of the weight sender is not visible to this worker (CUDA_VISIBLE_DEVICES)")
    slots = []
    for handle in handles:
        args = list(handle)
        args[_DEVICE_ARG] = index
        slots.append(rebuild_cuda_tensor(*args))
    return slots
