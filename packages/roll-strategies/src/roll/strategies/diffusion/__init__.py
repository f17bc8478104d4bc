"""Diffusion models (``diffusers``) as a model backend: tiny local builders (no hub), one prediction call for every
supported class, HF-style save/load with the noise scheduler, and FSDP2 sharding of blocks.

``diffusers`` is imported only when a model or scheduler is built or loaded; without it those calls raise
:class:`roll.runtime.MissingExtraError` with ``pip install 'roll-strategies[diffusion]'``.
"""

from __future__ import annotations

from roll.strategies.diffusion._models import (
    DIFFUSION_MODEL_CLASSES,
    DIFFUSION_PRESETS,
    SCHEDULER_CLASSES,
    build_diffusion_model,
    diffusion_model_class,
    load_diffusion_model,
    load_scheduler,
    make_scheduler,
    make_tiny_diffusion_model,
    predict,
    require_diffusers,
    save_diffusion_model,
)
from roll.strategies.diffusion._sharding import diffusion_blocks, full_state_dict, shard_diffusion_model

__all__ = [
    "DIFFUSION_MODEL_CLASSES",
    "DIFFUSION_PRESETS",
    "SCHEDULER_CLASSES",
    "build_diffusion_model",
    "diffusion_blocks",
    "diffusion_model_class",
    "full_state_dict",
    "load_diffusion_model",
    "load_scheduler",
    "make_scheduler",
    "make_tiny_diffusion_model",
    "predict",
    "require_diffusers",
    "save_diffusion_model",
    "shard_diffusion_model",
]
