"""Grading: correctness and format of generated answers, separately.

Every pipeline with a verifiable task reports the same two numbers on held-out prompts:

* ``correct``: the final answer is right, whatever its format. The answer is extracted format-insensitively
  (:func:`final_answer`): the last ``\\boxed{...}``, else the text after "answer is" / "answer:", else the last
  number; it is compared with :func:`roll.pipelines.rewards.math.answers_match`.
* ``format``: the response states its answer in the requested format (:func:`is_formatted`: a complete
  ``\\boxed{...}``), right or wrong.

A verifier that demands the format (``require_boxed``) scores ``correct and formatted``; reporting the two apart
shows whether training taught the skill or only the format. With ``k`` samples per prompt, ``pass@k`` is the
share of prompts with at least one correct sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from roll.pipelines.rewards.math import answers_match, extract_answer, extract_boxed

__all__ = ["Grade", "answer_metrics", "final_answer", "grade_answer", "grade_answers", "is_formatted"]


@dataclass(frozen=True)
class Grade:
    """One response's verdict: its extracted answer, whether that is right, whether it is in the format."""

    answer: str | None
    correct: bool
    formatted: bool


def final_answer(response: str) -> str | None:
    """The response's final answer in any format (boxed, "The answer is 19.", a last number), or None."""
    return extract_answer(response or "")


def is_formatted(response: str) -> bool:
    """Whether the response gives a non-empty answer in the requested format: a complete ``\\boxed{...}``."""
    boxed = extract_boxed(response or "")
    return bool(boxed and boxed.strip())


def grade_answer(response: str, ground_truth: str, *, timeout_s: float = 5.0) -> Grade:
    """Grade ``response`` against ``ground_truth``: correctness ignores the format; a verifier timeout is wrong."""
    answer = final_answer(response)
    truth = str(ground_truth if ground_truth is not None else "").strip()
    correct = False
    if answer is not None and truth:
        try:
            correct = answers_match(answer, truth, timeout_s)
        except TimeoutError:
            correct = False
    return Grade(answer=answer, correct=correct, formatted=is_formatted(response))


def grade_answers(responses: Sequence[str], ground_truths: Sequence[str]) -> list[Grade]:
    """:func:`grade_answer` row by row; the two sequences must have the same length."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths; they pair up row by row")
    return [grade_answer(r, t) for r, t in zip(responses, ground_truths)]


def answer_metrics(grades: Sequence[Grade], *, k: int = 1, prefix: str = "val/") -> dict[str, float]:
    """``correct``, ``format`` and ``correct_and_format`` shares; with ``k`` > 1 also ``pass@k``.

    With ``k`` > 1, ``grades`` holds ``k`` consecutive samples per prompt; ``correct`` and ``format`` are then
    means over all samples.
    """
    if not grades:
        return {}
    correct = torch.tensor([g.correct for g in grades], dtype=torch.float32)
    formatted = torch.tensor([g.formatted for g in grades], dtype=torch.float32)
    out = {
        f"{prefix}correct": float(correct.mean()),
        f"{prefix}format": float(formatted.mean()),
        f"{prefix}correct_and_format": float((correct * formatted).mean()),
    }
    if k > 1:
        if len(grades) % k:
            raise ValueError(f"{len(grades)} grades do not split into groups of k={k} samples per prompt")
        out[f"{prefix}pass@{k}"] = float(correct.view(-1, k).max(-1).values.mean())
    return out
