"""FSDP2 sharding of diffusion models: ``fully_shard`` each block, then the root (stem, embeddings, head).

The counterpart of ``fsdp2._model.shard_model`` (which wraps the decoder layers of a causal LM) for diffusers
models; it works over gloo on CPUs and NCCL on GPUs alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from roll.runtime import ConfigError
from roll.strategies.diffusion._models import diffusion_model_class

__all__ = ["diffusion_blocks", "full_state_dict", "shard_diffusion_model"]


def diffusion_blocks(model: nn.Module, block_classes: Sequence[str] | None = None) -> list[nn.Module]:
    """The modules that become FSDP units: UNet down/mid/up blocks, DiT transformer blocks, or ``block_classes``."""
    if block_classes:
        names = set(block_classes)
        blocks = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    elif diffusion_model_class(model) == "UNet2DModel":
        unet: Any = model
        blocks = [*unet.down_blocks, *([unet.mid_block] if unet.mid_block is not None else []), *unet.up_blocks]
    else:
        dit: Any = model
        blocks = list(dit.transformer_blocks)
    if not blocks:
        raise ConfigError(
            f"no block of {type(model).__name__} matches {sorted(block_classes or [])}; give the class names of "
            "its repeated blocks (e.g. 'DownBlock2D', 'BasicTransformerBlock')"
        )
    return blocks


def _reused_units(model: nn.Module) -> list[nn.Module]:
    """Submodules of a block that the model also calls from outside that block, so they need their own FSDP unit
    (a unit's parameters are gathered only inside its own forward): DiT conditions its output layer with
    ``transformer_blocks[0].norm1.emb``."""
    if diffusion_model_class(model) == "DiTTransformer2DModel":
        dit: Any = model
        norm = getattr(dit.transformer_blocks[0], "norm1", None)
        emb = getattr(norm, "emb", None)
        return [emb] if isinstance(emb, nn.Module) else []
    return []


def shard_diffusion_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    block_classes: Sequence[str] | None = None,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype = torch.float32,
    wrap_blocks: bool = True,
) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (1-D, or 2-D replicate x shard for HSDP) and return it.

    With ``wrap_blocks`` off the whole model is one FSDP unit: on one rank its gradients are then bit for bit
    the unwrapped model's (block units add autograd hooks at block boundaries, which change the order in which
    the UNet's skip-connection gradients are summed).
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    units = [*_reused_units(model), *diffusion_blocks(model, block_classes)] if wrap_blocks else []
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root's parameters (stem, time/class embeddings, output head) are needed again at once for backward.
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard_after_forward else False, mp_policy=policy)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full, unsharded CPU tensors of a sharded (or plain) model, on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state: dict[str, torch.Tensor] = dict(
        get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # type: ignore[arg-type]
    )
    return state
