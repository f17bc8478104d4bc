"""RL with verifiable rewards: PPO, GRPO, REINFORCE++, RLOO, GSPO and DAPO-style dynamic sampling."""

from __future__ import annotations

from roll.pipelines.rlvr.config import RewardConfig, RLVRConfig
from roll.pipelines.rlvr.pipeline import RLVRPipeline

__all__ = ["RLVRConfig", "RLVRPipeline", "RewardConfig"]
