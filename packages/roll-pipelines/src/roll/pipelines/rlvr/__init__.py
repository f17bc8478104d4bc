"""RL with verifiable rewards: PPO, GRPO, REINFORCE++, RLOO, GSPO and DAPO-style dynamic sampling."""

from __future__ import annotations

from roll.pipelines.rlvr.config import FLAT_KEYS, RLVRConfig
from roll.pipelines.rlvr.pipeline import RLVRPipeline
from roll.pipelines.rlvr.sections import (
    AdvantageSection,
    CorrectionSection,
    DynamicSamplingSection,
    KLSection,
    OverlongSection,
    PolicyLossSection,
    RewardConfig,
    RolloutSection,
    UpdateSection,
    ValidationSection,
    ValueLossSection,
)
from roll.pipelines.rlvr.settings import ActorSettings, CriticSettings, PolicySettings
from roll.pipelines.rlvr.workers import ActorWorker, CriticWorker, InferWorker, PolicyWorker, actor_loss

__all__ = [
    "FLAT_KEYS",
    "ActorSettings",
    "ActorWorker",
    "AdvantageSection",
    "CorrectionSection",
    "CriticSettings",
    "CriticWorker",
    "DynamicSamplingSection",
    "InferWorker",
    "KLSection",
    "OverlongSection",
    "PolicyLossSection",
    "PolicySettings",
    "PolicyWorker",
    "RLVRConfig",
    "RLVRPipeline",
    "RewardConfig",
    "RolloutSection",
    "UpdateSection",
    "ValidationSection",
    "ValueLossSection",
    "actor_loss",
]
