"""Validation on held-out prompts: correctness and format apart, the verifier's score, pass@k, per tag.

``val/correct`` grades each answer format-insensitively against its ``ground_truth``
(:mod:`roll.pipelines.evaluation`); ``val/format`` is the share of answers in the requested format (a complete
``\\boxed{}``). Rows without a ``ground_truth`` (e.g. code) count as correct when the verifier gives full marks.
``val/score`` and ``val/accuracy`` are the verifier's mean score and share of full marks: what training
optimizes, format requirements included. With ``k`` samples per prompt, ``val/pass@k`` is the share of prompts
with a correct sample (``val/score_pass@k``: with full marks). With on-policy distillation, ``val/kl_to_teacher``
(``/<name>`` per teacher when there are several) is the token-mean ``log p_student - log p_teacher`` on the
student's validation samples routed to each teacher (the k1 estimate of the reverse KL on held-out prompts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from roll.pipelines.data import PromptCollator
from roll.pipelines.evaluation import FULL_MARKS, grade_rollouts, share
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.opd import kl_metrics
from roll.pipelines.stages import batched
from roll.protocol import DataProto
from roll.strategies import GenerationConfig

__all__ = ["validate_policy", "validation_generation_config"]

CORRECT = FULL_MARKS


_VALIDATION_SEED_OFFSET = 7_340_033  # keeps validation's sampling seed apart from the training steps' seeds


def validation_generation_config(config: RLVRConfig) -> GenerationConfig:
    """``validation.generating_args`` with the response budget, or greedy decoding by default.

    Sampled validation (a ROLL file's ``temperature: 0.6``) gets a seed when it has none: the same at every
    validation, from the run's ``seed``, so before/after compare under the same sampling noise and a rerun logs the
    same values (unseeded, it drew from the engine's generator, whose state depends on what ran before)."""
    base = config.validation.generating_args or GenerationConfig(temperature=0.0, num_return_sequences=1)
    update: dict[str, object] = {"max_new_tokens": config.rollout.response_length}
    if base.seed is None:
        update["seed"] = (config.seed + _VALIDATION_SEED_OFFSET) % 2**31
    return base.model_copy(update=update)


def validate_policy(
    rollouts: Any,
    prompts: Sequence[Mapping[str, Any]],
    collator: PromptCollator,
    config: RLVRConfig,
    teacher_kl: Callable[[DataProto], Mapping[str, tuple[float, float]]] | None = None,
) -> dict[str, float]:
    """Validation metrics; with ``teacher_kl`` (on-policy distillation: per teacher, the KL sum and token count of
    a scored batch), ``val/kl_to_teacher`` and per named teacher ``val/kl_to_teacher/<name>``."""
    generation = validation_generation_config(config)
    kl_sums: dict[str, tuple[float, float]] = {}
    k = generation.num_return_sequences
    scores, tags = [], []
    correct: list[bool] = []
    formatted: list[bool | None] = []
    for prompt_batch in batched(prompts, config.validation.batch_size, collator):
        batch = rollouts.score(rollouts.generate(prompt_batch, generation))
        scores.append(batch.batch["scores"].float())
        tags += list(batch.non_tensor_batch["tag"])
        rows_correct, rows_formatted = grade_rollouts(batch)
        correct += rows_correct
        formatted += rows_formatted
        for name, (total, tokens) in (teacher_kl(batch) if teacher_kl is not None else {}).items():
            before = kl_sums.get(name, (0.0, 0.0))
            kl_sums[name] = (before[0] + total, before[1] + tokens)
    score = torch.cat(scores)
    full_marks = (score >= CORRECT).float()
    solved = torch.tensor(correct, dtype=torch.float32)
    metrics = {
        "val/score": float(score.mean()),
        "val/accuracy": float(full_marks.mean()),
        "val/correct": float(solved.mean()),
    }
    if kl_sums:
        metrics.update(kl_metrics(kl_sums, "val/kl_to_teacher"))
    format_share = share(formatted)
    if format_share is not None:
        metrics["val/format"] = format_share
    if k > 1:
        metrics[f"val/pass@{k}"] = float(solved.view(-1, k).max(-1).values.mean())
        metrics[f"val/score_pass@{k}"] = float(full_marks.view(-1, k).max(-1).values.mean())
    for tag in sorted(set(tags)):
        rows = torch.tensor([t == tag for t in tags])
        metrics[f"val/accuracy/{tag}"] = float(full_marks[rows].mean())
        metrics[f"val/correct/{tag}"] = float(solved[rows].mean())
    return metrics
