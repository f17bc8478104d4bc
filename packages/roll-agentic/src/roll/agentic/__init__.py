"""roll.agentic: multi-turn agentic RL on roll: environments, tools, env managers, EnvironmentWorkers and the
rollout scheduler, with ROLL's concepts and config names.

A rollout: the :class:`RolloutScheduler` plays groups of episodes (``group_size`` envs per group sharing a seed) on
EnvironmentWorkers (or in-process); each env manager sends one :class:`GenerateRequest` per turn to a
:class:`PolicyClient` as soon as its env is ready, and lays finished episodes out as RLVR-style samples
(trajectory-wise or step-wise). Faulty envs end their episode with a reason; dead workers have their episodes
replayed elsewhere.
"""

from __future__ import annotations

from roll.agentic.config import (
    CustomEnvConfig,
    EnvManagerConfig,
    RewardNormalizationConfig,
    ToolConfig,
    ToolWrapperConfig,
)
from roll.agentic.env import ENVS, Env, EnvLike, FrozenLakeEnv, SokobanEnv, make_env, parse_action, register_env
from roll.agentic.env_manager import (
    ENV_MANAGERS,
    EnvManager,
    EpisodeResult,
    EpisodeTask,
    StepEnvManager,
    TrajEnvManager,
    concat_samples,
)
from roll.agentic.policy import (
    ClusterPolicyClient,
    GenerateRequest,
    GenerateResult,
    LatencyModel,
    MockPolicyClient,
    PolicyClient,
    RandomActionPolicy,
    RemotePolicyClient,
    ScriptedPolicy,
    serve_policy,
)
from roll.agentic.pool import EnvPool, EnvSlot
from roll.agentic.scheduler import GroupFilter, RolloutBatch, RolloutScheduler, ZeroVarianceGroupFilter
from roll.agentic.tools import TOOLS, Tool, ToolEnvWrapper, make_tool, parse_tool_calls, register_tool
from roll.agentic.worker import EnvironmentWorker, EnvWorkerSetup

__version__ = "0.1.0"

__all__ = [
    "ENVS",
    "ENV_MANAGERS",
    "TOOLS",
    "ClusterPolicyClient",
    "CustomEnvConfig",
    "Env",
    "EnvLike",
    "EnvManager",
    "EnvManagerConfig",
    "EnvPool",
    "EnvSlot",
    "EnvWorkerSetup",
    "EnvironmentWorker",
    "EpisodeResult",
    "EpisodeTask",
    "FrozenLakeEnv",
    "GenerateRequest",
    "GenerateResult",
    "GroupFilter",
    "LatencyModel",
    "MockPolicyClient",
    "PolicyClient",
    "RandomActionPolicy",
    "RemotePolicyClient",
    "RewardNormalizationConfig",
    "RolloutBatch",
    "RolloutScheduler",
    "ScriptedPolicy",
    "SokobanEnv",
    "StepEnvManager",
    "Tool",
    "ToolConfig",
    "ToolEnvWrapper",
    "ToolWrapperConfig",
    "TrajEnvManager",
    "ZeroVarianceGroupFilter",
    "concat_samples",
    "make_env",
    "make_tool",
    "parse_action",
    "parse_tool_calls",
    "register_env",
    "register_tool",
    "serve_policy",
]
