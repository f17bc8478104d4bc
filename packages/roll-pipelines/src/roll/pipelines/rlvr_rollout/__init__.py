"""Rollout-only RLVR: generate responses to a prompt set and score them, with no training."""

from __future__ import annotations

from roll.pipelines.rlvr_rollout.config import RLVRRolloutConfig, RolloutOnlySection
from roll.pipelines.rlvr_rollout.pipeline import SUMMARY_FILE, RLVRRolloutPipeline
from roll.pipelines.rlvr_rollout.summary import RolloutTotals, format_summary, rollout_metrics
from roll.pipelines.rlvr_rollout.writer import ROLLOUT_FIELDS, ROLLOUTS_FILE, RolloutWriter, read_rollouts

__all__ = [
    "ROLLOUTS_FILE",
    "ROLLOUT_FIELDS",
    "SUMMARY_FILE",
    "RLVRRolloutConfig",
    "RLVRRolloutPipeline",
    "RolloutOnlySection",
    "RolloutTotals",
    "RolloutWriter",
    "format_summary",
    "read_rollouts",
    "rollout_metrics",
]
