"""roll.pipelines: configs, the ``roll`` command, BasePipeline and shared stages, checkpoints, tracking, data,
algorithms and the SFT / DPO / RLVR (+ rollout-only) pipelines."""

from __future__ import annotations

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
