"""Validation on held-out prompts: mean score, accuracy and pass@k, overall and per tag."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.pipelines.data import PromptCollator
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.stages import batched
from roll.strategies import GenerationConfig

__all__ = ["validate_policy", "validation_generation_config"]

CORRECT = 1.0 - 1e-6


def validation_generation_config(config: RLVRConfig) -> GenerationConfig:
    """``validation.generating_args`` with the response budget, or greedy decoding by default."""
    base = config.validation.generating_args or GenerationConfig(temperature=0.0, num_return_sequences=1)
    return base.model_copy(update={"max_new_tokens": config.rollout.response_length})


def validate_policy(
    rollouts: Any, prompts: Sequence[Mapping[str, Any]], collator: PromptCollator, config: RLVRConfig
) -> dict[str, float]:
    generation = validation_generation_config(config)
    k = generation.num_return_sequences
    scores, tags = [], []
    for prompt_batch in batched(prompts, config.validation.batch_size, collator):
        batch = rollouts.score(rollouts.generate(prompt_batch, generation))
        scores.append(batch.batch["scores"].float())
        tags += list(batch.non_tensor_batch["tag"])
    score = torch.cat(scores)
    correct = (score >= CORRECT).float()
    metrics = {"val/score": float(score.mean()), "val/accuracy": float(correct.mean())}
    if k > 1:
        metrics[f"val/pass@{k}"] = float(correct.view(-1, k).max(-1).values.mean())
    for tag in sorted(set(tags)):
        rows = torch.tensor([t == tag for t in tags])
        metrics[f"val/accuracy/{tag}"] = float(correct[rows].mean())
    return metrics
