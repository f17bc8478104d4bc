"""Code reward: run the response's program against test cases in the sandbox (:mod:`.sandbox`).

Test cases come in two kinds (:func:`parse_test_cases`):

* **stdin/stdout**: ``[{"input": "...", "output": "..."}, ...]`` (or that list as a JSON string, or the APPS/TACO
  form ``{"inputs": [...], "outputs": [...]}``). A test passes when the program exits 0 and its output equals the
  expected one after stripping trailing spaces on every line and blank lines at both ends.
* **assert statements**: a list of statements, or one source string whose top-level ``assert`` statements are
  the tests (other top-level statements are setup run before each following assert). Each test program is the
  response's code followed by the setup and the assert; it passes when it exits 0.

ROLL's code data is read too: stdin/stdout cases as ``{"stdin": ..., "expected_stdout": ...}``, assert cases as
``{"assert_code": "..."}`` (or plain strings) in ``test_cases``; an ``assert_code`` block that defines ``test_*``
functions is one test that calls them all, as ROLL's runner does. ROLL's ``text`` and ``check_based`` case types
(tests that read the response's text, or a checker program) are not run: such a row scores 0 with that reason.

Every test runs in its own sandbox process, so a test that crashes, hangs or exhausts a limit cannot affect
another test's result.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from roll.pipelines.rewards.base import RewardWorker
from roll.pipelines.rewards.sandbox import SandboxLimits, run_untrusted, sandbox_layers
from roll.runtime import ConfigError

__all__ = ["CODE_FALLBACKS", "CodeSandboxRewardWorker", "CodeTest", "code_score", "extract_code", "parse_test_cases"]

CODE_FALLBACKS = ("none", "any_fence", "any_fence_or_raw")
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("python", "py", "python3")


@dataclass(frozen=True)
class CodeTest:
    """One test: ``kind == "io"`` feeds ``stdin`` and expects ``expected`` on stdout; ``"assert"`` appends
    ``setup`` and ``statement`` to the program."""

    kind: Literal["io", "assert"]
    stdin: str = ""
    expected: str = ""
    setup: str = ""
    statement: str = ""


def extract_code(response: str, fallback: str = "any_fence") -> str | None:
    """The last fenced ```python block of ``response``. Without one: ``fallback="any_fence"`` takes the last fenced
    block in any language, ``"any_fence_or_raw"`` then the whole response if it parses as Python, ``"none"`` gives
    None."""
    if fallback not in CODE_FALLBACKS:
        raise ConfigError(f"code fallback must be one of {CODE_FALLBACKS}, got {fallback!r}")
    blocks = _FENCE.findall(response or "")
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    if fallback != "none" and blocks:
        return blocks[-1][1]
    if fallback == "any_fence_or_raw" and response and response.strip():
        try:
            ast.parse(response)
        except SyntaxError:
            return None
        return response
    return None


def _assert_tests(source: str) -> list[CodeTest]:
    """Top-level asserts of ``source`` as tests, each preceded by the non-assert statements before it."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"test source does not parse: {e}") from e
    setup: list[str] = []
    tests = []
    for node in tree.body:
        text = ast.get_source_segment(source, node) or ast.unparse(node)
        if isinstance(node, ast.Assert):
            tests.append(CodeTest("assert", setup="\n".join(setup), statement=text))
        else:
            setup.append(text)
    return tests


_TEST_FUNCTION = re.compile(r"^\s*def (test_\w*)\s*\(", re.MULTILINE)


def _case_tests(case: Mapping[str, Any] | str) -> list[CodeTest]:
    """One test case of ``test_cases``: a stdin/stdout pair (roll's ``input``/``output`` or ROLL's
    ``stdin``/``expected_stdout``), or assert code (ROLL's ``{"assert_code": ...}`` or a plain string)."""
    if isinstance(case, str) or "assert_code" in case:
        source = str(case if isinstance(case, str) else case["assert_code"])
        functions = _TEST_FUNCTION.findall(source)
        if functions:  # pytest-style: one test that runs every test function, as ROLL's assert runner does
            calls = "\n".join(f"{name}()" for name in functions)
            return [CodeTest("assert", setup=source, statement=calls)]
        return _assert_tests(source)
    for stdin, expected in (("input", "output"), ("stdin", "expected_stdout")):
        if stdin in case and expected in case:
            return [CodeTest("io", stdin=_as_text(case[stdin]), expected=_as_text(case[expected]))]
    raise ValueError(
        f"a test case needs 'input' and 'output' (or ROLL's 'stdin' and 'expected_stdout', or 'assert_code'), got "
        f"{sorted(case)}"
    )


def _as_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)


_ROLL_UNRUN_CASE_TYPES = ("text", "check_based")


def parse_test_cases(test_cases: Any = None, tests: Any = None, case_type: Any = None) -> list[CodeTest]:
    """Normalise a row's ``test_cases`` (stdin/stdout pairs, or ROLL's case dicts) and/or ``tests`` (assert
    statements) into tests; ``case_type`` is ROLL's column of that name, when the row has it."""
    if case_type in _ROLL_UNRUN_CASE_TYPES:
        raise ValueError(
            f"ROLL's case_type {case_type!r} (tests on the response's text, or a checker program) is not run by roll's "
            "code reward; score these rows with another reward domain"
        )
    parsed: list[CodeTest] = []
    if isinstance(test_cases, str) and test_cases.strip():
        try:
            test_cases = json.loads(test_cases)
        except json.JSONDecodeError:
            tests, test_cases = ([tests] if tests else []) + [test_cases], None  # plain Python: assert source
    if isinstance(test_cases, Mapping):
        if "inputs" in test_cases and "outputs" in test_cases:
            pairs = zip(test_cases["inputs"], test_cases["outputs"])
            test_cases = [{"input": i, "output": o} for i, o in pairs]
        elif "tests" in test_cases:
            tests, test_cases = test_cases["tests"], None
        else:
            test_cases = [test_cases]
    for case in test_cases or []:
        if not isinstance(case, Mapping | str):
            raise ValueError(f"each test case must be a mapping or assert code, got {type(case).__name__}")
        parsed.extend(_case_tests(case))
    if isinstance(tests, str) and tests.lstrip().startswith("["):
        with contextlib.suppress(json.JSONDecodeError):  # else: Python source starting with a list literal
            tests = json.loads(tests)  # a JSON list of statements
    for item in [tests] if isinstance(tests, str) else list(tests or []):
        parsed.extend(_assert_tests(str(item)))
    return parsed


def _normalize_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _clip(text: str, limit: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def run_test(code: str, test: CodeTest, limits: SandboxLimits) -> tuple[bool, str]:
    """Run one test in a fresh sandbox: ``(passed, reason)``."""
    limit_kwargs = {k: getattr(limits, k) for k in SandboxLimits.__dataclass_fields__}
    if test.kind == "io":
        result = run_untrusted(code, stdin=test.stdin, **limit_kwargs)
        if not result.ok:
            return False, result.reason
        got, expected = _normalize_output(result.stdout), _normalize_output(test.expected)
        return (True, "") if got == expected else (False, f"wrong answer: got {_clip(got)}, expected {_clip(expected)}")
    program = f"{code}\n\n{test.setup}\n{test.statement}\n" if test.setup else f"{code}\n\n{test.statement}\n"
    result = run_untrusted(program, **limit_kwargs)
    if result.ok:
        return True, ""
    if result.reason.startswith("AssertionError"):
        return False, f"assertion failed: {test.statement[:80]}"
    return False, result.reason


def code_score(
    response: str,
    test_cases: list[CodeTest] | Any,
    limits: SandboxLimits | Mapping[str, Any] | None = None,
    *,
    partial_credit: bool = True,
    fallback: str = "any_fence",
    format_score: float = 0.0,
) -> tuple[float, str]:
    """The fraction of tests the response's program passes (all-or-nothing without ``partial_credit``, which also
    stops at the first failure). Reasons: ``"correct"`` or ``"test 2 failed: <why> (1/3 passed)"``."""
    if not isinstance(limits, SandboxLimits):
        limits = SandboxLimits.from_mapping(dict(limits or {}))
    if not (isinstance(test_cases, list) and all(isinstance(t, CodeTest) for t in test_cases)):
        test_cases = parse_test_cases(test_cases)
    if not test_cases:
        return 0.0, "no test cases"
    code = extract_code(response, fallback)
    if code is None:
        return format_score, "no ```python code block"
    passed, first_failure = 0, ""
    for index, test in enumerate(test_cases, start=1):
        ok, reason = run_test(code, test, limits)
        passed += ok
        if not ok and not first_failure:
            first_failure = f"test {index} failed: {reason}"
            if not partial_credit:
                break
    total = len(test_cases)
    if passed == total:
        return 1.0, "correct"
    score = passed / total if partial_credit else 0.0
    return score, f"{first_failure} ({passed}/{total} passed)"


class CodeSandboxRewardWorker(RewardWorker):
    """Scores rows by :func:`code_score` on ``response_text`` and the row's ``test_cases``/``tests``.

    reward_kwargs: ``partial_credit`` (True), ``fallback`` ("any_fence"), ``format_score`` (0.0, no code block),
    ``sandbox`` (dict of :class:`SandboxLimits` fields, e.g. ``{"timeout_s": 5, "memory_mb": 512}``) and
    ``num_workers`` (rows scored in parallel, each test in its own sandbox process).
    """

    required_fields = (("test_cases", "tests"),)

    default_kwargs = {"partial_credit": True, "fallback": "any_fence", "format_score": 0.0, "sandbox": None}

    def setup(self, kwargs: dict[str, Any]) -> None:
        if kwargs["fallback"] not in CODE_FALLBACKS:
            raise ConfigError(f"reward_kwargs.fallback must be one of {CODE_FALLBACKS}, got {kwargs['fallback']!r}")
        self.limits = SandboxLimits.from_mapping(kwargs["sandbox"])
        self.partial_credit = bool(kwargs["partial_credit"])
        layers = sandbox_layers()  # probe now (once per process) rather than inside the first scoring call
        self.logger.info("%s: code sandbox layers: %s", self.worker_name, layers)

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        tests = parse_test_cases(row.get("test_cases"), row.get("tests"), row.get("case_type"))
        return code_score(
            row.get("response_text") or "",
            tests,
            self.limits,
            partial_credit=self.partial_credit,
            fallback=self.reward_kwargs["fallback"],
            format_score=self.reward_kwargs["format_score"],
        )
