"""Grading scored rollouts (RLVR batches): correctness and format per sampled response."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roll.pipelines.evaluation.grading import grade_answer

__all__ = ["FULL_MARKS", "grade_rollouts", "share"]

# A verifier score at or above this is full marks.
FULL_MARKS = 1.0 - 1e-6


def grade_rollouts(batch: Any) -> tuple[list[bool], list[bool | None]]:
    """Per row of a scored batch (``response_text``, ``scores``, optional ``ground_truth``): whether the answer is
    correct and whether it is formatted.

    Rows with a ground truth are graded format-insensitively (:func:`grade_answer`); rows without one (judged
    answers) and rows with test cases (code: a ROLL code row's ``ground_truth`` is a reference program, not an
    answer) count as correct when the verifier gives full marks, and their format is None (not graded).
    """
    columns = batch.non_tensor_batch
    texts = columns["response_text"]
    truths = columns["ground_truth"] if "ground_truth" in columns else [None] * len(batch)
    tested = [_has_tests(columns, i) for i in range(len(batch))]
    scores = batch.batch["scores"].float().tolist()
    correct: list[bool] = []
    formatted: list[bool | None] = []
    for text, truth, has_tests, score in zip(texts, truths, tested, scores):
        if has_tests or _blank(truth):
            correct.append(score >= FULL_MARKS)
            formatted.append(None)
        else:
            grade = grade_answer(str(text), str(truth))
            correct.append(grade.correct)
            formatted.append(grade.formatted)
    return correct, formatted


def _blank(value: Any) -> bool:
    if isinstance(value, list | tuple | dict):
        return not value
    return value is None or str(value).strip() == ""


def _has_tests(columns: Any, row: int) -> bool:
    """Whether row ``row`` carries code tests (``test_cases`` or ``tests``), which the code reward runs."""
    return any(key in columns and not _blank(columns[key][row]) for key in ("test_cases", "tests"))


def share(flags: Sequence[bool | None]) -> float | None:
    """The share of True among the graded (not None) flags; None when nothing was graded."""
    graded = [flag for flag in flags if flag is not None]
    return sum(graded) / len(graded) if graded else None
