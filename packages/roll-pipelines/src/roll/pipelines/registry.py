"""Pipeline names -> classes (each class names its config class), resolved lazily."""

from __future__ import annotations

from typing import Any

from roll.runtime import ConfigError, Registry, import_target

__all__ = ["PIPELINES", "resolve_pipeline"]

PIPELINES: Registry[type] = Registry("pipeline", entry_point_group="roll.pipelines")
PIPELINES.register("sft", "roll.pipelines.sft.pipeline:SFTPipeline")
PIPELINES.register("dpo", "roll.pipelines.dpo.pipeline:DPOPipeline")
PIPELINES.register("rlvr", "roll.pipelines.rlvr.pipeline:RLVRPipeline")
PIPELINES.register("rlvr_rollout", "roll.pipelines.rlvr_rollout.pipeline:RLVRRolloutPipeline")
PIPELINES.register("distill", "roll.pipelines.distill.pipeline:DistillPipeline")
PIPELINES.register("diffusion_pretrain", "roll.pipelines.diffusion.pretrain:DiffusionPretrainPipeline")
PIPELINES.register("diffusion_reward_fl", "roll.pipelines.diffusion.reward_fl:RewardFLPipeline")
PIPELINES.register("diffusion_dmd", "roll.pipelines.diffusion.dmd:DMDPipeline")
PIPELINES.register("diffusion_ode_distill", "roll.pipelines.diffusion.ode_distill:ODEDistillPipeline")


def resolve_pipeline(name: str) -> Any:
    """A pipeline class from a registered name or ``"package.module:Class"``; checks it declares ``config_cls``."""
    if name in PIPELINES:
        cls = PIPELINES.get(name)
    elif ":" in name or "." in name:
        cls = import_target(name, "pipeline_cls")
    else:
        raise ConfigError(f"unknown pipeline_cls {name!r}; use one of {PIPELINES.names()} or 'package.module:Class'")
    if not isinstance(getattr(cls, "config_cls", None), type):
        raise ConfigError(f"pipeline_cls {name!r} ({cls!r}) must define a `config_cls` attribute (its config class)")
    return cls
