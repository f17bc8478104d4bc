"""roll.pipelines: configs, the ``roll`` command, BasePipeline and shared stages, checkpoints, tracking, data,
algorithms and the SFT / DPO / RLVR (+ rollout-only) pipelines.

The names below are imported on first use (PEP 562), so ``roll --help``, ``roll --version`` and ``roll recipes``
start without importing torch, Ray or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roll.pipelines.base import BasePipeline, Role, Session
    from roll.pipelines.checkpoint import CheckpointManager, PipelineState
    from roll.pipelines.config import BaseConfig, RoleConfig, load_config
    from roll.pipelines.launcher import build_pipeline, prepare_config, run_config
    from roll.pipelines.registry import PIPELINES, resolve_pipeline
    from roll.pipelines.stages import (
        BatchStream,
        DataSplits,
        StepTimer,
        UpdatePlan,
        batched,
        is_eval_step,
        load_split,
        load_splits,
        run_update,
    )
    from roll.pipelines.tracking import Tracker, read_metrics

__version__ = "0.1.0"

__all__ = [
    "PIPELINES",
    "BaseConfig",
    "BasePipeline",
    "BatchStream",
    "CheckpointManager",
    "DataSplits",
    "PipelineState",
    "Role",
    "RoleConfig",
    "Session",
    "StepTimer",
    "Tracker",
    "UpdatePlan",
    "batched",
    "build_pipeline",
    "is_eval_step",
    "load_config",
    "load_split",
    "load_splits",
    "prepare_config",
    "read_metrics",
    "resolve_pipeline",
    "run_config",
    "run_update",
]

_EXPORTS = {
    "BaseConfig": "roll.pipelines.config",
    "BasePipeline": "roll.pipelines.base",
    "batched": "roll.pipelines.stages",
    "BatchStream": "roll.pipelines.stages",
    "build_pipeline": "roll.pipelines.launcher",
    "CheckpointManager": "roll.pipelines.checkpoint",
    "DataSplits": "roll.pipelines.stages",
    "is_eval_step": "roll.pipelines.stages",
    "load_config": "roll.pipelines.config",
    "load_split": "roll.pipelines.stages",
    "load_splits": "roll.pipelines.stages",
    "PIPELINES": "roll.pipelines.registry",
    "PipelineState": "roll.pipelines.checkpoint",
    "prepare_config": "roll.pipelines.launcher",
    "read_metrics": "roll.pipelines.tracking",
    "resolve_pipeline": "roll.pipelines.registry",
    "Role": "roll.pipelines.base",
    "RoleConfig": "roll.pipelines.config",
    "run_config": "roll.pipelines.launcher",
    "run_update": "roll.pipelines.stages",
    "Session": "roll.pipelines.base",
    "StepTimer": "roll.pipelines.stages",
    "Tracker": "roll.pipelines.tracking",
    "UpdatePlan": "roll.pipelines.stages",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'roll.pipelines' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
