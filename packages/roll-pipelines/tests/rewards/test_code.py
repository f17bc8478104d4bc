"""Code extraction, test-case parsing and sandboxed scoring of programs against stdin/stdout and assert tests."""

from __future__ import annotations

import json

import pytest

from roll.pipelines.rewards import CodeSandboxRewardWorker, CodeTest, code_score, extract_code, parse_test_cases
from roll.runtime import ConfigError, DataProto, WorkerConfig

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
IO_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 9", "output": "19"}, {"input": "-1 1", "output": "0"}]
FUNCTION = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"


class RewardRoleConfig(WorkerConfig):
    reward_type: str = "code"
    reward_kwargs: dict = {}


def test_extract_code_takes_the_last_python_block_and_falls_back():
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```text\nnot code\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("```\nprint(3)\n```", fallback="none") is None
    assert extract_code("print(4)", fallback="any_fence_or_raw") == "print(4)"
    assert extract_code("this is not python (", fallback="any_fence_or_raw") is None
    assert extract_code("no code at all") is None
    with pytest.raises(ConfigError, match="fallback"):
        extract_code("x", fallback="raw")


def test_parse_test_cases_accepts_the_common_forms():
    io = [CodeTest("io", stdin="1", expected="2")]
    assert parse_test_cases([{"input": "1", "output": "2"}]) == io
    assert parse_test_cases(json.dumps([{"input": "1", "output": "2"}])) == io
    assert parse_test_cases({"inputs": ["1"], "outputs": ["2"]}) == io
    asserts = parse_test_cases(tests="import math\nassert add(1, 2) == 3\nx = 5\nassert add(x, 1) == 6")
    assert [(t.setup, t.statement) for t in asserts] == [
        ("import math", "assert add(1, 2) == 3"),
        ("import math\nx = 5", "assert add(x, 1) == 6"),
    ]
    assert len(parse_test_cases(tests=["assert add(1, 1) == 2", "assert add(0, 0) == 0"])) == 2
    assert len(parse_test_cases(tests=json.dumps(["assert add(1, 1) == 2"]))) == 1
    assert parse_test_cases(None, None) == []
    with pytest.raises(ValueError, match="'input' and 'output'"):
        parse_test_cases([{"stdin": "1"}])


def test_correct_program_passes_every_stdin_stdout_test():
    assert code_score(ADD, IO_TESTS) == (1.0, "correct")


def test_wrong_program_fails_with_the_first_difference():
    wrong = ADD.replace("a + b", "a * b")
    score, info = code_score(wrong, IO_TESTS)
    assert score == 0.0
    assert info == "test 1 failed: wrong answer: got '2', expected '3' (0/3 passed)"


def test_partial_credit_and_all_or_nothing():
    special = "```python\na, b = map(int, input().split())\nprint(19 if a == 10 else a - b)\n```"  # passes test 2 only
    score, info = code_score(special, IO_TESTS)
    assert score == pytest.approx(1 / 3)
    assert info.startswith("test 1 failed: wrong answer") and info.endswith("(1/3 passed)")
    assert code_score(special, IO_TESTS, partial_credit=False)[0] == 0.0


def test_a_hanging_or_crashing_test_does_not_affect_the_others():
    program = (
        "```python\nimport os\na, b = map(int, input().split())\n"
        "if a == 10:\n    while True:\n        pass\n"
        "if a == -1:\n    os.system('true')\n"
        "print(a + b)\n```"
    )
    score, info = code_score(program, IO_TESTS, {"timeout_s": 1, "cpu_s": 10})
    assert score == pytest.approx(1 / 3)
    assert info == "test 2 failed: timeout after 1 s (1/3 passed)"


def test_assert_tests_pass_and_fail():
    tests = "assert add(1, 2) == 3\nassert add(5, 0) == 5"
    assert code_score(FUNCTION, parse_test_cases(tests=tests)) == (1.0, "correct")
    bad = FUNCTION.replace("a + b", "a - b")
    score, info = code_score(bad, parse_test_cases(tests=tests))
    assert score == pytest.approx(0.5)
    assert info == "test 1 failed: assertion failed: assert add(1, 2) == 3 (1/2 passed)"


def test_missing_code_block_and_missing_tests():
    assert code_score("I don't know", IO_TESTS, format_score=-0.1) == (-0.1, "no ```python code block")
    assert code_score(ADD, []) == (0.0, "no test cases")


def test_code_worker_scores_rows_and_isolates_a_bad_row():
    worker = CodeSandboxRewardWorker(
        RewardRoleConfig(name="code_reward", reward_kwargs={"sandbox": {"timeout_s": 3}, "num_workers": 3})
    )
    worker.initialize(None)
    batch = DataProto.from_dict(
        non_tensors={
            "prompt": ["p"] * 3,
            "response_text": [ADD, FUNCTION, ADD],
            "tag": ["code"] * 3,
            "test_cases": [json.dumps(IO_TESTS), None, json.dumps([3])],
            "tests": [None, "assert add(2, 2) == 4", None],
        }
    )
    out = worker.compute_rewards(batch)
    assert out["scores"].tolist() == [1.0, 1.0, 0.0]
    infos = out["reward_info"].tolist()
    assert infos[:2] == ["correct", "correct"]
    assert infos[2].startswith("scoring error: ValueError: each test case must be a mapping or assert code")


def test_code_worker_rejects_bad_sandbox_settings():
    worker = CodeSandboxRewardWorker(RewardRoleConfig(reward_kwargs={"sandbox": {"wall": 1}}))
    with pytest.raises(ConfigError, match="unknown sandbox limit"):
        worker.initialize(None)


def test_rolls_code_cases_are_read_as_rolls_worker_reads_them():
    """ROLL's code data: ``{"stdin", "expected_stdout"}`` pairs and ``{"assert_code"}`` blocks (a block of
    ``test_*`` functions runs them all); before, every such row scored 0 ("needs 'input' and 'output' keys")."""
    io = [{"stdin": "2 3\n", "expected_stdout": "5\n"}, {"stdin": "10 -4\n", "expected_stdout": "6\n"}]
    assert code_score(ADD, json.dumps(io)) == (1.0, "correct")
    blocks = [{"assert_code": "assert add(2, 2) == 4\nassert add(0, 0) == 0"}]
    assert code_score(FUNCTION, blocks) == (1.0, "correct")
    pytest_style = [
        {"assert_code": "def test_small():\n    assert add(1, 1) == 2\n\ndef test_big():\n    assert add(5, 5) == 11\n"}
    ]
    tests = parse_test_cases(pytest_style)
    assert [(t.kind, t.statement) for t in tests] == [("assert", "test_small()\ntest_big()")]
    score, reason = code_score(FUNCTION, tests)
    assert score == 0.0 and "assertion failed" in reason  # test_big fails: the block fails, as in ROLL
    with pytest.raises(ValueError, match="ROLL's case_type 'text'"):
        parse_test_cases(io, case_type="text")
