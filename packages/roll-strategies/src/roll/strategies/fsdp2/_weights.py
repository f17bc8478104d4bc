"""Full HF-named weights out of a sharded model (LoRA merged), and loading full weights back into shards."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from roll.strategies.contract import StrategyError
from roll.strategies.fsdp2._model import hf_model, reshard

__all__ = ["full_tensor", "iter_full_weights", "load_full_weights"]

_LM_HEAD = "lm_head.weight"


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The unsharded tensor (an all-gather for a DTensor: every rank of its mesh must call this)."""
    return value.full_tensor() if isinstance(value, DTensor) else value


def _lora_layers(base: nn.Module) -> dict[str, Any]:
    """peft LoRA layers of the HF model by module name ({} without peft or adapters)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return {}
    layers = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            if not isinstance(module.get_base_layer(), nn.Linear):
                raise StrategyError(f"LoRA on {type(module.get_base_layer()).__name__} ({name}) cannot be merged yet")
            layers[name] = module
    return layers


def _merged(layer: Any, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` plus the active adapters' ``scaling * B @ A``, computed in float32."""
    merged = weight.float()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if layer.use_dora.get(adapter, False):
            raise StrategyError("DoRA adapters cannot be merged by fsdp2 yet; disable use_dora")
        a = full_tensor(layer.lora_A[adapter].weight.detach()).float()
        b = full_tensor(layer.lora_B[adapter].weight.detach()).float()
        delta = b @ a
        if getattr(layer, "fan_in_fan_out", False):
            delta = delta.T
        merged = merged + delta * layer.scaling[adapter]
    return merged.to(weight.dtype)


def iter_full_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) one at a time, floating tensors cast to ``dtype``; a collective on every rank.

    LoRA adapters are merged into their base weights under the base names. ``lm_head.weight`` is produced even
    when it is tied to the input embeddings, because inference engines expect it.
    """
    reshard(model)  # parameters must be the sharded DTensors, not a leftover gathered copy
    base = hf_model(model)
    lora = _lora_layers(base)
    seen_lm_head = False
    # Everything is detached, so no grad-mode context is needed (one held across yields would leak to the caller).
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        module_name, _, leaf = key.rpartition(".")
        owner = module_name.removesuffix(".base_layer")
        name = f"{owner}.{leaf}" if owner else leaf
        tensor = full_tensor(value.detach())
        if leaf == "weight" and owner in lora and module_name.endswith(".base_layer"):
            tensor = _merged(lora[owner], tensor)
        seen_lm_head = seen_lm_head or name == _LM_HEAD
        yield name, _cast(tensor, dtype)
    get_embeddings = getattr(base, "get_input_embeddings", None)
    if not seen_lm_head and callable(get_embeddings) and getattr(base.config, "tie_word_embeddings", False):
        yield _LM_HEAD, _cast(full_tensor(get_embeddings().weight.detach()), dtype)


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def load_full_weights(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy full tensors (HF names, present on every rank) into this rank's shards; returns how many were loaded.

    No communication: each rank cuts its own shard out of the full tensor. LoRA-wrapped models are not supported.
    """
    if hf_model(model) is not model:
        raise StrategyError("loading weights into a LoRA-wrapped FSDP2 model is not supported")
    reshard(model)
    targets = model.state_dict(keep_vars=True)
    loaded = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                raise StrategyError(f"received weight {name!r}, which the model does not have")
            if tuple(tensor.shape) != tuple(target.shape):
                raise StrategyError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}"
                )
            if isinstance(target, DTensor):
                source = tensor.to(device=target.device, dtype=target.dtype)
                shard = distribute_tensor(source, target.device_mesh, target.placements, src_data_rank=None)
                target.to_local().copy_(shard.to_local())
            else:
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            loaded += 1
    return loaded
