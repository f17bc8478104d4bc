"""Rollout scheduling: env groups and seeds, group filters, episode executors (local or Ray) and batch assembly."""

from __future__ import annotations

from roll.agentic.scheduler.executors import AllWorkersLostError, EpisodeExecutor, LocalExecutor, RayExecutor
from roll.agentic.scheduler.faulted_steps import FaultedSteps, RolloutFaultsError, describe_faults
from roll.agentic.scheduler.filters import GroupFilter, ZeroVarianceGroupFilter
from roll.agentic.scheduler.metrics import summarize_episodes
from roll.agentic.scheduler.plan import GroupPlan, episode_ids, episode_seed, plan_groups, slots_by_rank
from roll.agentic.scheduler.scheduler import RolloutBatch, RolloutScheduler, check_custom_envs

__all__ = [
    "AllWorkersLostError",
    "EpisodeExecutor",
    "FaultedSteps",
    "GroupFilter",
    "GroupPlan",
    "LocalExecutor",
    "RayExecutor",
    "RolloutBatch",
    "RolloutFaultsError",
    "RolloutScheduler",
    "ZeroVarianceGroupFilter",
    "check_custom_envs",
    "describe_faults",
    "episode_ids",
    "episode_seed",
    "plan_groups",
    "slots_by_rank",
    "summarize_episodes",
]
