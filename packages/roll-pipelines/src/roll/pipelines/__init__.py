"""roll.pipelines: configs, the ``roll`` command, BasePipeline, checkpoints, tracking, data, algorithms and the
SFT / DPO / RLVR pipelines."""

from __future__ import annotations

from roll.pipelines.base import BasePipeline
from roll.pipelines.checkpoint import CheckpointManager, PipelineState
from roll.pipelines.config import BaseConfig, RoleConfig, load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.registry import PIPELINES, resolve_pipeline
from roll.pipelines.tracking import Tracker, read_metrics

__version__ = "0.1.0"

__all__ = [
    "PIPELINES",
    "BaseConfig",
    "BasePipeline",
    "CheckpointManager",
    "PipelineState",
    "RoleConfig",
    "Tracker",
    "load_config",
    "read_metrics",
    "resolve_pipeline",
    "run_config",
]
