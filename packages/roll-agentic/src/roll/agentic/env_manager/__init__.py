"""Env managers: episodes of one env slot against a PolicyClient, laid out as trajectory- or step-wise samples."""

from __future__ import annotations

from roll.agentic.env_manager.base import EnvManager, EpisodeResult, EpisodeState, EpisodeTask, Turn, turn_seed
from roll.agentic.env_manager.chat import ChatFormatter, render_template
from roll.agentic.env_manager.native import AgentNativeStepEnvManager, render_messages
from roll.agentic.env_manager.runner import FAULT_REASONS, EnvFault, EnvRunner
from roll.agentic.env_manager.samples import LAYOUT_KEYS, SampleRow, concat_samples, rows_to_batch
from roll.agentic.env_manager.step import StepConcatEnvManager, StepEnvManager, state_hash
from roll.agentic.env_manager.traj import TrajEnvManager
from roll.runtime import Registry

ENV_MANAGERS: Registry[type[EnvManager]] = Registry("env manager", entry_point_group="roll.agentic.env_managers")
ENV_MANAGERS.register("traj", TrajEnvManager)
ENV_MANAGERS.register("step", StepEnvManager)
ENV_MANAGERS.register("step_concat", StepConcatEnvManager)
ENV_MANAGERS.register("agent_native", AgentNativeStepEnvManager)

__all__ = [
    "ENV_MANAGERS",
    "FAULT_REASONS",
    "LAYOUT_KEYS",
    "AgentNativeStepEnvManager",
    "ChatFormatter",
    "EnvFault",
    "EnvManager",
    "EnvRunner",
    "EpisodeResult",
    "EpisodeState",
    "EpisodeTask",
    "SampleRow",
    "StepConcatEnvManager",
    "StepEnvManager",
    "TrajEnvManager",
    "Turn",
    "concat_samples",
    "render_messages",
    "render_template",
    "rows_to_batch",
    "state_hash",
    "turn_seed",
]
