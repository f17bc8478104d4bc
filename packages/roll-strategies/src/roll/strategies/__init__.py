"""roll.strategies: model backends (HF, FSDP2, vLLM, SGLang, Megatron, mock) behind one Strategy contract.

Backends are chosen by ``strategy_args.strategy_name`` and imported only when used; a missing backend raises
:class:`roll.runtime.MissingExtraError` with the pip command that installs it.
"""

from __future__ import annotations

from roll.strategies.base import InferenceStrategy, TrainStrategy
from roll.strategies.config import (
    BatchingArgs,
    GenerationConfig,
    ModelArgs,
    StrategyArgs,
    StrategyWorkerConfig,
    TrainingArgs,
)
from roll.strategies.contract import (
    SHARE,
    ForwardFunc,
    LossFunc,
    LossScale,
    ModelCall,
    ModelForwardFunc,
    ModelLossFunc,
    OffloadTarget,
    StrategyError,
    check_logits_to_keep,
)
from roll.strategies.model_update import ModelUpdateGroup
from roll.strategies.registry import (
    STRATEGIES,
    STRATEGY_CONFIGS,
    check_attention_installed,
    check_backend_installed,
    create_strategy,
    validate_strategy_config,
)
from roll.strategies.worker import StrategyWorker

__version__ = "0.1.0"

__all__ = [
    "SHARE",
    "STRATEGIES",
    "STRATEGY_CONFIGS",
    "BatchingArgs",
    "ForwardFunc",
    "GenerationConfig",
    "InferenceStrategy",
    "LossFunc",
    "LossScale",
    "ModelArgs",
    "ModelCall",
    "ModelForwardFunc",
    "ModelLossFunc",
    "ModelUpdateGroup",
    "OffloadTarget",
    "StrategyArgs",
    "StrategyError",
    "StrategyWorker",
    "StrategyWorkerConfig",
    "TrainStrategy",
    "TrainingArgs",
    "check_attention_installed",
    "check_backend_installed",
    "check_logits_to_keep",
    "create_strategy",
    "validate_strategy_config",
]
