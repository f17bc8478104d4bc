"""The strategies' hook for diffusion models (``model_args.model_kind: diffusion``): load a diffusers folder for a
role, call it on the strategy's device, and write it back as a diffusers folder with its scheduler.

FSDP2 and hf_infer call these in place of their causal-LM loading; everything else a strategy does (optimizer,
checkpoints, weight sync by name) is the same for both kinds of model.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from roll.runtime import ConfigError
from roll.strategies.contract import ModelCall
from roll.strategies.diffusion._models import (
    SCHEDULER_DIR,
    load_diffusion_model,
    load_scheduler,
    predict,
    save_diffusion_model,
)

__all__ = ["device_call", "export_diffusion_folder", "load_role_model"]


def load_role_model(path: str | None, dtype: torch.dtype, *, train: bool) -> nn.Module:
    """The diffusers model of a role (on the CPU in ``dtype``; frozen unless ``train``)."""
    if not path:
        raise ConfigError("model_args.model_name_or_path is not set; point it at a diffusers model folder")
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(
            f"model_args.model_name_or_path={path!r} is not a diffusers model folder (no config.json); with "
            "model_kind: diffusion give a folder written by save_diffusion_model or a recipe://diffusion-pretrain-tiny reference"
        )
    return load_diffusion_model(path, dtype=dtype, train=train)


def _on(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def device_call(model: nn.Module, device: torch.device) -> ModelCall:
    """``model_call(sample, timesteps, class_labels=None)``: the model's prediction, inputs moved to ``device``."""

    @functools.wraps(predict)
    def call(sample: torch.Tensor, timesteps: torch.Tensor, class_labels: torch.Tensor | None = None) -> torch.Tensor:
        return predict(model, sample.to(device), timesteps.to(device), _on(class_labels, device))

    return call


def export_diffusion_folder(
    path: str, model: nn.Module, named_weights: Iterable[tuple[str, torch.Tensor]], source: str | None, *, rank: int
) -> None:
    """Write ``model`` with the full ``named_weights`` (a collective every rank walks) and the scheduler of its
    ``source`` folder as a diffusers folder at ``path`` (rank 0 writes)."""
    state = {}
    for name, tensor in named_weights:
        if rank == 0:
            state[name] = tensor.detach().to("cpu", copy=True).contiguous()
    if rank != 0:
        return
    scheduler = load_scheduler(source) if source and (Path(source) / SCHEDULER_DIR).is_dir() else None
    save_diffusion_model(model, path, scheduler=scheduler, state_dict=state)
