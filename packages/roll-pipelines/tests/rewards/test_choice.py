"""Multiple-choice rule rewards (ROLL's CrossThinkQA and multiple-choice-boxed semantics)."""

from __future__ import annotations

import pytest

from roll.pipelines.rewards.choice import choice_answer, crossthinkqa_score


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>maybe \\boxed{A}</think>\n\nSo \\boxed{(C) blue}", ("C", True)),
        ("the answer is b, no: The answer is D.", ("D", False)),
        ("I pick B", ("I", False)),  # first capital of the whole answer, as ROLL
        ("no capitals here", (None, False)),
    ],
)
def test_choice_answer(response, expected):
    assert choice_answer(response) == expected


@pytest.mark.parametrize(
    ("mode", "scores"),
    [("soft", [1.0, 0.5, -0.5, -1.0]), ("loose", [1.0, 1.0, -1.0, -1.0]), ("strict", [1.0, -1.0, -1.0, -1.0])],
)
def test_crossthinkqa_modes(mode, scores):
    cases = ["\\boxed{A}", "the answer is A", "\\boxed{B}", "the answer is B"]
    assert [crossthinkqa_score(text, "A", mode)[0] for text in cases] == scores
