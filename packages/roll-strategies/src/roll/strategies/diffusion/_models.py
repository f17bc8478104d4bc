"""Diffusion models from ``diffusers``: tiny local builders, one call convention, HF-style save/load.

A diffusion model folder is a diffusers model saved with ``save_pretrained`` (``config.json`` +
``diffusion_pytorch_model.safetensors``) plus its noise scheduler in ``scheduler/`` (``scheduler_config.json``).
Only the classes in :data:`DIFFUSION_MODEL_CLASSES` and :data:`SCHEDULER_CLASSES` are loaded, so a folder never
names arbitrary code to import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from roll.runtime import ConfigError, import_extra

__all__ = [
    "DIFFUSION_MODEL_CLASSES",
    "DIFFUSION_PRESETS",
    "SCHEDULER_CLASSES",
    "build_diffusion_model",
    "diffusion_model_class",
    "load_diffusion_model",
    "load_scheduler",
    "make_scheduler",
    "make_tiny_diffusion_model",
    "predict",
    "require_diffusers",
    "save_diffusion_model",
]

SCHEDULER_DIR = "scheduler"

# Named sizes for 16x16 (or 32x32) RGB images with class conditioning; `num_classes` and `sample_size` are
# filled in by the builder. Parameter counts at 16x16 with 24 classes: unet-nano 0.27M, unet-micro 1.1M, dit-nano 0.4M.
DIFFUSION_PRESETS: dict[str, dict[str, Any]] = {
    "unet-nano": {
        "_class_name": "UNet2DModel",
        "block_out_channels": [16, 32, 32],
        "down_block_types": ["DownBlock2D", "DownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "UpBlock2D", "UpBlock2D"],
        "layers_per_block": 1,
        "norm_num_groups": 8,
    },
    "unet-micro": {
        "_class_name": "UNet2DModel",
        "block_out_channels": [32, 64, 64],
        "down_block_types": ["DownBlock2D", "DownBlock2D", "AttnDownBlock2D"],
        "up_block_types": ["AttnUpBlock2D", "UpBlock2D", "UpBlock2D"],
        "layers_per_block": 1,
        "norm_num_groups": 8,
        "attention_head_dim": 32,
    },
    "dit-nano": {
        "_class_name": "DiTTransformer2DModel",
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "num_layers": 4,
        "patch_size": 2,
        "norm_num_groups": 8,
    },
}


def require_diffusers() -> Any:
    """The ``diffusers`` module, or MissingExtraError with the pip command that installs it."""
    return import_extra("diffusers", "a diffusion model", "roll-strategies", "diffusion")


def _unet_call(model: nn.Module, sample: torch.Tensor, timesteps: torch.Tensor, labels: torch.Tensor | None):
    return model(sample, timesteps, class_labels=labels).sample


def _dit_call(model: nn.Module, sample: torch.Tensor, timesteps: torch.Tensor, labels: torch.Tensor | None):
    return model(sample, timestep=timesteps, class_labels=labels).sample


def _no_label_dropout(model: nn.Module) -> nn.Module:
    """Turn off the random label dropout diffusers' DiT applies in training mode (meant for classifier-free
    guidance): it makes every training forward random, which breaks reward and distillation gradients and
    the equality of sharded and unsharded steps."""
    for module in model.modules():
        if type(module).__name__ == "LabelEmbedding":
            label_embedding: Any = module
            label_embedding.dropout_prob = 0.0
    return model


def _unet_config(spec: dict[str, Any], num_classes: int, sample_size: int, channels: int) -> dict[str, Any]:
    return {
        "sample_size": sample_size,
        "in_channels": channels,
        "out_channels": channels,
        "num_class_embeds": num_classes,
        **spec,
    }


def _dit_config(spec: dict[str, Any], num_classes: int, sample_size: int, channels: int) -> dict[str, Any]:
    return {
        "sample_size": sample_size,
        "in_channels": channels,
        "out_channels": channels,
        "num_embeds_ada_norm": num_classes,
        **spec,
    }


# diffusers class name -> (forward call, config builder). The call maps (model, x_t, timesteps, class_labels) to
# the model's raw prediction (epsilon, v or flow velocity, as its scheduler says).
DIFFUSION_MODEL_CLASSES: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., dict[str, Any]]]] = {
    "UNet2DModel": (_unet_call, _unet_config),
    "DiTTransformer2DModel": (_dit_call, _dit_config),
}
SCHEDULER_CLASSES = ("DDPMScheduler", "DDIMScheduler", "FlowMatchEulerDiscreteScheduler")


def diffusion_model_class(model: nn.Module) -> str:
    """The diffusers class name of ``model`` (FSDP2 wraps it in a subclass, so the MRO is searched)."""
    for cls in type(model).__mro__:
        if cls.__name__ in DIFFUSION_MODEL_CLASSES:
            return cls.__name__
    raise ConfigError(
        f"{type(model).__name__} is not a supported diffusion model; supported: {sorted(DIFFUSION_MODEL_CLASSES)}"
    )


def predict(
    model: nn.Module, sample: torch.Tensor, timesteps: torch.Tensor, class_labels: torch.Tensor | None = None
) -> torch.Tensor:
    """The model's prediction for noisy ``sample`` (B, C, H, W) at ``timesteps`` (B,) float, whatever its class."""
    call, _ = DIFFUSION_MODEL_CLASSES[diffusion_model_class(model)]
    return call(model, sample, timesteps, class_labels)


def _model_cls(name: str) -> Any:
    if name not in DIFFUSION_MODEL_CLASSES:
        raise ConfigError(
            f"diffusion model class {name!r} is not supported; use one of {sorted(DIFFUSION_MODEL_CLASSES)}"
        )
    return getattr(require_diffusers(), name)


def build_diffusion_model(
    preset: str | Mapping[str, Any] = "unet-nano",
    *,
    num_classes: int = 24,
    sample_size: int = 16,
    channels: int = 3,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """A random-init class-conditional model from a preset name or a config dict with ``_class_name``.

    The global RNG is restored afterwards, so building a model does not shift the caller's random stream.
    """
    if isinstance(preset, str):
        if preset not in DIFFUSION_PRESETS:
            raise ConfigError(f"unknown diffusion preset {preset!r}; choose one of {sorted(DIFFUSION_PRESETS)}")
        spec = dict(DIFFUSION_PRESETS[preset])
    else:
        spec = dict(preset)
    spec.update(overrides or {})
    class_name = spec.pop("_class_name", None)
    if class_name is None:
        raise ConfigError("a diffusion model config needs '_class_name' (e.g. 'UNet2DModel')")
    cls = _model_cls(class_name)
    _, make_config = DIFFUSION_MODEL_CLASSES[class_name]
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return _no_label_dropout(cls(**make_config(spec, num_classes, sample_size, channels)))
    finally:
        torch.random.set_rng_state(state)


def make_scheduler(kind: str = "flow", *, num_train_timesteps: int = 1000, prediction_type: str = "epsilon") -> Any:
    """A diffusers noise scheduler: ``flow`` (rectified flow, FlowMatchEulerDiscreteScheduler), ``ddpm`` or ``ddim``
    (linear-beta variance-preserving schedule, predicting ``epsilon`` or ``v_prediction``)."""
    diffusers = require_diffusers()
    if kind == "flow":
        return diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=1.0)
    if prediction_type not in ("epsilon", "v_prediction"):
        raise ConfigError(f"prediction_type must be 'epsilon' or 'v_prediction', got {prediction_type!r}")
    cls = {"ddpm": diffusers.DDPMScheduler, "ddim": diffusers.DDIMScheduler}.get(kind)
    if cls is None:
        raise ConfigError(f"unknown scheduler kind {kind!r}; choose 'flow', 'ddpm' or 'ddim'")
    return cls(num_train_timesteps=num_train_timesteps, prediction_type=prediction_type, clip_sample=False)


def _read_class_name(config_path: Path, allowed: Any, what: str) -> str:
    if not config_path.is_file():
        raise ConfigError(f"{config_path} does not exist; {what} folders are written by save_diffusion_model")
    name = json.loads(config_path.read_text()).get("_class_name")
    if name not in allowed:
        raise ConfigError(
            f"{config_path}: _class_name {name!r} is not a supported {what}; supported: {sorted(allowed)}"
        )
    return name


def load_diffusion_model(path: str | Path, *, dtype: torch.dtype = torch.float32, train: bool = True) -> nn.Module:
    """The model saved in ``path`` (on the CPU, in ``dtype``); frozen when ``train`` is False."""
    path = Path(path)
    name = _read_class_name(path / "config.json", DIFFUSION_MODEL_CLASSES, "diffusion model")
    model = _model_cls(name).from_pretrained(path, torch_dtype=dtype, local_files_only=True, low_cpu_mem_usage=False)
    _no_label_dropout(model).train(train)
    if not train:
        model.requires_grad_(False)
    return model


def load_scheduler(path: str | Path) -> Any:
    """The noise scheduler saved next to a model (``path/scheduler``)."""
    folder = Path(path) / SCHEDULER_DIR
    name = _read_class_name(folder / "scheduler_config.json", SCHEDULER_CLASSES, "noise scheduler")
    return getattr(require_diffusers(), name).from_pretrained(folder, local_files_only=True)


def save_diffusion_model(
    model: nn.Module,
    path: str | Path,
    *,
    scheduler: Any = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``model`` (or its class with ``state_dict``, e.g. one gathered from FSDP2 shards) as a diffusers folder.

    The folder is written next to ``path`` and renamed into place, so a reader never sees half a model.
    ``extra_files`` maps file names to text written alongside (e.g. a provenance stamp).
    """
    path = Path(path)
    name = diffusion_model_class(model)
    target: Any = model
    if state_dict is not None or type(model).__name__ != name:
        # A sharded (FSDPxxx) module cannot be saved directly: rebuild the plain class and load full tensors.
        plain: Any = model
        target = _model_cls(name).from_config(dict(plain.config))
        missing, unexpected = target.load_state_dict(
            dict(state_dict if state_dict is not None else model.state_dict()), strict=False
        )
        if missing or unexpected:
            raise ConfigError(f"state dict does not match {name}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        target.save_pretrained(tmp, safe_serialization=True)
        if scheduler is not None:
            scheduler.save_pretrained(tmp / SCHEDULER_DIR)
        for file_name, text in (extra_files or {}).items():
            (tmp / file_name).write_text(text)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _fingerprint(settings: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def make_tiny_diffusion_model(
    path: str | Path,
    *,
    preset: str = "unet-nano",
    scheduler: str = "flow",
    prediction_type: str = "epsilon",
    num_classes: int = 24,
    sample_size: int = 16,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write a random-init class-conditional model and its scheduler to ``path`` and return the path.

    Idempotent: a folder already built with the same settings is reused.
    """
    settings = {
        "preset": preset,
        "scheduler": scheduler,
        "prediction_type": prediction_type,
        "num_classes": num_classes,
        "sample_size": sample_size,
        "seed": seed,
        "overrides": dict(overrides or {}),
    }
    path = Path(path)
    stamp = path / "roll_tiny.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == _fingerprint(settings):
        return path
    model = build_diffusion_model(
        preset, num_classes=num_classes, sample_size=sample_size, seed=seed, overrides=overrides
    )
    num_params = sum(p.numel() for p in model.parameters())
    stamp_text = json.dumps({"fingerprint": _fingerprint(settings), "num_parameters": num_params, **settings}, indent=1)
    sched = make_scheduler(scheduler, prediction_type=prediction_type)
    return save_diffusion_model(model, path, scheduler=sched, extra_files={"roll_tiny.json": stamp_text})
