"""Grading answers: correctness ignores the format, the format is reported on its own."""

from __future__ import annotations

import pytest

from roll.pipelines.evaluation import Grade, answer_metrics, final_answer, grade_answer, grade_answers, is_formatted


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"The answer is \boxed{19}.", "19"),
        ("The answer is 19.", "19"),
        ("The answer is 19", "19"),
        (r"The answer is \boxed{-7}.", "-7"),
        ("The answer is -7.", "-7"),
        ("so we get 3, then 12 - 20 = -8", "-8"),
        (r"first 4, then \boxed{5}, and 6 after", "5"),  # a boxed answer wins over later numbers
        ("The answer is", None),
        ("banana", None),
        ("", None),
    ],
)
def test_final_answer_accepts_boxed_and_plain_answers(response: str, expected: str | None) -> None:
    assert final_answer(response) == expected


@pytest.mark.parametrize(
    ("response", "formatted"),
    [
        (r"The answer is \boxed{19}.", True),
        (r"\boxed{-3}", True),
        ("The answer is 19.", False),
        (r"The answer is \boxed{19", False),  # never closed
        (r"The answer is \boxed{}.", False),  # empty
        ("", False),
    ],
)
def test_is_formatted_wants_a_complete_non_empty_box(response: str, formatted: bool) -> None:
    assert is_formatted(response) is formatted


def test_grade_answer_separates_correctness_from_format() -> None:
    assert grade_answer(r"The answer is \boxed{19}.", "19") == Grade("19", correct=True, formatted=True)
    assert grade_answer("The answer is 19.", "19") == Grade("19", correct=True, formatted=False)
    assert grade_answer(r"The answer is \boxed{18}.", "19") == Grade("18", correct=False, formatted=True)
    assert grade_answer("The answer is -19.", "-19").correct
    assert not grade_answer("The answer is 19.", "-19").correct
    assert grade_answer("no idea", "19") == Grade(None, correct=False, formatted=False)
    assert not grade_answer(r"\boxed{19}", "").correct  # no ground truth: never correct


def test_answer_metrics_and_pass_at_k() -> None:
    texts = [r"\boxed{1}", "1", r"\boxed{0}", "0", r"\boxed{2}", "2"]
    grades = grade_answers(texts, ["1", "1", "1", "1", "3", "3"])
    metrics = answer_metrics(grades, k=2)
    assert metrics == {
        "val/correct": pytest.approx(2 / 6),
        "val/format": pytest.approx(3 / 6),
        "val/correct_and_format": pytest.approx(1 / 6),
        "val/pass@2": pytest.approx(1 / 3),  # prompt 0 solved (twice), prompts 1 and 2 not
    }
    assert answer_metrics(grades[:2], prefix="eval/") == {
        "eval/correct": 1.0,
        "eval/format": 0.5,
        "eval/correct_and_format": 0.5,
    }
    assert answer_metrics([]) == {}
    with pytest.raises(ValueError, match="groups of k=4"):
        answer_metrics(grades, k=4)
    with pytest.raises(ValueError, match="pair up"):
        grade_answers(["1"], [])
