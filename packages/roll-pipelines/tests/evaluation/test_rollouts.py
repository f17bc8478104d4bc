"""Grading scored rollouts: math rows by their answer, code rows (test cases) and rows without a truth by the
verifier's score."""

from __future__ import annotations

import json

import numpy as np
import torch

from roll.pipelines.evaluation import grade_rollouts
from roll.protocol import DataProto

SOLUTION = "def add(a, b):\n    return a + b"


def _batch(rows: list[dict[str, object]], scores: list[float]) -> DataProto:
    keys = sorted({key for row in rows for key in row})
    columns = {}
    for key in keys:
        column = np.empty(len(rows), dtype=object)  # one cell per row, lists included
        for i, row in enumerate(rows):
            column[i] = row.get(key, "")
        columns[key] = column
    return DataProto.from_dict({"scores": torch.tensor(scores)}, columns)


def test_a_code_row_with_a_reference_program_is_graded_by_its_tests() -> None:
    # ROLL's code rows (KodCode) carry the reference program as ground_truth: a JSON list of source strings
    code = {
        "response_text": f"```python\n{SOLUTION}\n```",
        "ground_truth": json.dumps([SOLUTION]),
        "test_cases": json.dumps([{"assert_code": "assert add(1, 2) == 3"}]),
        "case_type": "assert",
    }
    wrong = {**code, "response_text": "```python\ndef add(a, b):\n    return 0\n```"}
    math = {"response_text": "so \\boxed{5}", "ground_truth": "5", "test_cases": "", "case_type": ""}
    unboxed = {**math, "response_text": "it is 5"}
    correct, formatted = grade_rollouts(_batch([code, wrong, math, unboxed], [1.0, 0.0, 1.0, 0.0]))
    assert correct == [True, False, True, True]
    assert formatted == [None, None, True, False]  # a program is not an answer to box: its format is not graded


def test_rows_without_a_truth_or_with_empty_tests_follow_the_rules_they_had() -> None:
    judged = {"response_text": "anything", "ground_truth": "", "tests": []}
    listed = {"response_text": "```python\nprint(3)\n```", "ground_truth": "", "tests": ["assert True"]}
    math = {"response_text": "\\boxed{7}", "ground_truth": "7", "tests": []}
    correct, formatted = grade_rollouts(_batch([judged, judged, listed, math], [1.0, 0.5, 0.0, 0.0]))
    assert correct == [True, False, False, True]
    assert formatted == [None, None, None, True]
