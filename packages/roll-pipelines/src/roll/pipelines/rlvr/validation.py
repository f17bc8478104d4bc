"""Validation on held-out prompts: correctness and format apart, the verifier's score, pass@k, per tag.

``val/correct`` grades each answer format-insensitively against its ``ground_truth``
(:mod:`roll.pipelines.evaluation`); ``val/format`` is the share of answers in the requested format (a complete
``\\boxed{}``). Rows without a ``ground_truth`` (e.g. code) count as correct when the verifier gives full marks.
``val/score`` and ``val/accuracy`` are the verifier's mean score and share of full marks: what training
optimizes, format requirements included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.pipelines.data import PromptCollator
from roll.pipelines.evaluation import grade_answer
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.stages import batched
from roll.strategies import GenerationConfig

__all__ = ["validate_policy", "validation_generation_config"]

CORRECT = 1.0 - 1e-6


def validation_generation_config(config: RLVRConfig) -> GenerationConfig:
    """``validation.generating_args`` with the response budget, or greedy decoding by default."""
    base = config.validation.generating_args or GenerationConfig(temperature=0.0, num_return_sequences=1)
    return base.model_copy(update={"max_new_tokens": config.rollout.response_length})


def _grade_rows(batch: Any) -> tuple[list[bool], list[bool | None]]:
    """Per row: correct (format-insensitive where a ground truth exists) and formatted (None without one)."""
    columns = batch.non_tensor_batch
    texts = columns["response_text"]
    truths = columns["ground_truth"] if "ground_truth" in columns else [None] * len(batch)
    scores = batch.batch["scores"].float().tolist()
    correct: list[bool] = []
    formatted: list[bool | None] = []
    for text, truth, score in zip(texts, truths, scores):
        if truth is None or str(truth).strip() == "":
            correct.append(score >= CORRECT)
            formatted.append(None)
        else:
            grade = grade_answer(str(text), str(truth))
            correct.append(grade.correct)
            formatted.append(grade.formatted)
    return correct, formatted


def _mean(values: list[bool]) -> float:
    return float(sum(values)) / len(values) if values else 0.0


def validate_policy(
    rollouts: Any, prompts: Sequence[Mapping[str, Any]], collator: PromptCollator, config: RLVRConfig
) -> dict[str, float]:
    generation = validation_generation_config(config)
    k = generation.num_return_sequences
    scores, tags = [], []
    correct: list[bool] = []
    formatted: list[bool | None] = []
    for prompt_batch in batched(prompts, config.validation.batch_size, collator):
        batch = rollouts.score(rollouts.generate(prompt_batch, generation))
        scores.append(batch.batch["scores"].float())
        tags += list(batch.non_tensor_batch["tag"])
        rows_correct, rows_formatted = _grade_rows(batch)
        correct += rows_correct
        formatted += rows_formatted
    score = torch.cat(scores)
    full_marks = (score >= CORRECT).float()
    graded_format = [f for f in formatted if f is not None]
    metrics = {
        "val/score": float(score.mean()),
        "val/accuracy": float(full_marks.mean()),
        "val/correct": _mean(correct),
    }
    if graded_format:
        metrics["val/format"] = _mean(graded_format)
    if k > 1:
        solved = torch.tensor(correct, dtype=torch.float32).view(-1, k).max(-1).values
        metrics[f"val/pass@{k}"] = float(solved.mean())
        metrics[f"val/score_pass@{k}"] = float(full_marks.view(-1, k).max(-1).values.mean())
    for tag in sorted(set(tags)):
        rows = [t == tag for t in tags]
        metrics[f"val/accuracy/{tag}"] = float(full_marks[torch.tensor(rows)].mean())
        metrics[f"val/correct/{tag}"] = _mean([c for c, r in zip(correct, rows) if r])
    return metrics
