"""ROLL's dataset envs: one question of a dataset per episode, answered in one turn (``roll_math``, ``roll_qa``,
``roll_code``).

``reset(seed)`` asks the question of row ``seed % len(dataset)`` (see :mod:`roll.agentic.env.dataset` for where the
rows come from and how seeds pick them); the first response ends the episode with reward 1 if it is right, else 0
(``format_penalty`` when it holds no answer in the expected form: ``info["action_is_valid"]`` is then False).
``info["success"]`` says whether it was right. With ROLL's ``tool_wrapper`` (python_code, search, ...) tool calls are
answered by the tools and the episode goes on until a response without one.

* ``roll_math``: the last ``\\boxed{...}`` of the response, graded by roll's math grader
  (:func:`roll.pipelines.rewards.answers_match`: normalised, numeric and symbolic equality, within ``timeout_s``).
* ``roll_qa``: the last ``<answer>...</answer>`` (or ``\\boxed{...}`` with ``extract_boxed``), right when it equals
  one of the row's answers (a string or a list) after lower-casing and removing punctuation, articles and extra
  spaces, as GEM's QA env grades.
* ``roll_code``: the response's last fenced code block (```python preferred) run against the row's tests in roll's
  code sandbox (:func:`roll.pipelines.rewards.code_score`); right when every test passes. Tests are stdin/stdout
  pairs (``{"inputs": [...], "outputs": [...]}``, a list of ``{"input", "output"}``, or either as JSON text) or
  assert statements; at most ``max_tests`` (those with the longest inputs) are run.

``max_steps`` in ``env_config`` is accepted as ROLL's files write it and, as in ROLL, read by nothing: the episode
ends at the first answer, and the entry's own ``max_steps`` bounds its turns (tool calls included).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import string
from abc import abstractmethod
from typing import Any, ClassVar

from roll.agentic.env.base import Env, ResetOutput, StepOutput
from roll.agentic.env.dataset import LongestRows, check_dataset, load_questions, longest_rows, row_for_seed
from roll.agentic.env.parsing import ACTION_PATTERN
from roll.pipelines.data import DataError
from roll.pipelines.rewards import (
    CodeTest,
    SandboxLimits,
    answers_match,
    code_score,
    extract_boxed,
    extract_code,
    parse_test_cases,
)
from roll.runtime import ConfigError, RollError

__all__ = ["RollCodeEnv", "RollMathEnv", "RollQaEnv", "normalize_text"]

QA_INSTRUCTION = "Answer the question. Think it through, then give the final answer in <answer>...</answer>."
QA_BOXED_INSTRUCTION = "Answer the question. Think it through, then give the final answer in \\boxed{...}."
_ANSWER = re.compile(ACTION_PATTERN, re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


class _DatasetEnv(Env):
    """One question per episode from a dataset's rows; subclasses grade the response (:meth:`grade`)."""

    env_type: ClassVar[str]
    answer_option: ClassVar[str]
    """The env_config option naming the column the grade reads (``answer_key``, ``test_key``)."""
    answer_types: ClassVar[Any]
    seed_is_index = True

    def __init__(
        self,
        dataset_name: str,
        split: str | None,
        question_key: str,
        answer_key: str,
        format_penalty: float,
        env_instruction: str,
    ) -> None:
        self.dataset_name, self.format_penalty, self.env_instruction = dataset_name, format_penalty, env_instruction
        self.question_key, self.answer_key = question_key, answer_key
        columns = {"question_key": (question_key, str), self.answer_option: (answer_key, self.answer_types)}
        self.rows = load_questions(dataset_name, split, columns, env=self.env_type)
        self.index = -1
        self.row: dict[str, Any] = {}

    @classmethod
    def _dataset_args(cls, env_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:
        """The constructor's arguments for ``env_config`` (defaults applied) and the columns its rows must hold."""
        bound = inspect.signature(cls).bind(**env_config)
        bound.apply_defaults()
        args = bound.arguments
        columns = {
            "question_key": (args["question_key"], str),
            cls.answer_option: (args[cls.answer_option], cls.answer_types),
        }
        return args, columns

    @classmethod
    def check_args(cls, **env_config: Any) -> str:
        """``roll validate``: the dataset is there (a local one is read and its rows checked; see
        :func:`~roll.agentic.env.dataset.check_dataset`)."""
        args, columns = cls._dataset_args(env_config)
        return check_dataset(args["dataset_name"], args["split"], columns, env=cls.env_type)

    @classmethod
    def longest_questions(cls, tokenizer: Any, **env_config: Any) -> LongestRows:
        """The load-time length check (:mod:`roll.agentic.pipeline.lengths`): the rows whose questions are longest in
        ``tokenizer``'s tokens (the seed that plays a row is its index)."""
        args, columns = cls._dataset_args(env_config)
        rows = load_questions(args["dataset_name"], args["split"], columns, env=cls.env_type)
        return longest_rows(rows, args["question_key"], tokenizer, dataset=args["dataset_name"])

    def reset(self, seed: int | None = None) -> ResetOutput:
        self.index = row_for_seed(self.rows, seed)
        self.row = self.rows[self.index]
        return self.row[self.question_key], {"env_instruction": self.env_instruction, "success": False}

    @abstractmethod
    def grade(self, response: str) -> tuple[bool, bool, str]:
        """``(the response holds an answer, it is right, why)`` for the current row."""

    def step(self, action: str) -> StepOutput:
        if not self.row:
            raise RollError(f"{self.env_type}: step() called before reset()")
        valid, correct, reason = self.grade(action)
        reward = (1.0 if correct else 0.0) if valid else self.format_penalty
        info = {"success": correct, "action_is_valid": valid, "reason": reason, "row": self.index}
        return ("Correct." if correct else "Incorrect."), reward, True, False, info


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


class RollMathEnv(_DatasetEnv):
    """``roll_math``: a math question; the answer is the response's last ``\\boxed{...}``."""

    env_type = "roll_math"
    answer_option = "answer_key"
    answer_types = (str, int, float)

    def __init__(
        self,
        dataset_name: str,
        split: str | None = None,
        question_key: str = "problem",
        answer_key: str = "answer",
        timeout_s: float = 5.0,
        format_penalty: float = 0.0,
        env_instruction: str = "",
        max_steps: int | None = None,
    ) -> None:
        super().__init__(dataset_name, split, question_key, answer_key, format_penalty, env_instruction)
        self.timeout_s = timeout_s

    def grade(self, response: str) -> tuple[bool, bool, str]:
        answer = extract_boxed(response)
        if answer is None:
            return False, False, "no \\boxed answer"
        truth = str(self.row[self.answer_key])
        try:
            correct = answers_match(answer, truth, self.timeout_s)
        except TimeoutError as e:
            return True, False, str(e)
        return True, correct, "correct" if correct else f"wrong answer: got {_clip(answer)}, expected {_clip(truth)}"


def normalize_text(text: str) -> str:
    """Lower case, without punctuation, articles (a, an, the) and extra spaces: how QA answers are compared."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


class RollQaEnv(_DatasetEnv):
    """``roll_qa``: a question with one or more accepted answers; the answer is the response's last
    ``<answer>...</answer>`` (``extract_boxed``: its last ``\\boxed{...}``)."""

    env_type = "roll_qa"
    answer_option = "answer_key"
    answer_types = (str, int, float, list)

    def __init__(
        self,
        dataset_name: str,
        split: str | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        extract_boxed: bool = False,
        format_penalty: float = 0.0,
        env_instruction: str | None = None,
        max_steps: int | None = None,
    ) -> None:
        if env_instruction is None:
            env_instruction = QA_BOXED_INSTRUCTION if extract_boxed else QA_INSTRUCTION
        super().__init__(dataset_name, split, question_key, answer_key, format_penalty, env_instruction)
        self.extract_boxed = extract_boxed

    def grade(self, response: str) -> tuple[bool, bool, str]:
        if self.extract_boxed:
            answer = extract_boxed(response)
        else:
            matches = _ANSWER.findall(response)
            answer = matches[-1].strip() if matches else None
        if answer is None:
            return False, False, "no \\boxed answer" if self.extract_boxed else "no <answer>...</answer>"
        truth = self.row[self.answer_key]
        accepted = [str(a) for a in truth] if isinstance(truth, list) else [str(truth)]
        correct = normalize_text(answer) in {normalize_text(a) for a in accepted}
        return True, correct, "correct" if correct else f"wrong answer: got {_clip(answer)}, expected {accepted[:3]}"


class RollCodeEnv(_DatasetEnv):
    """``roll_code``: a programming problem; the response's last code block must pass the row's tests."""

    env_type = "roll_code"
    answer_option = "test_key"
    answer_types = object  # parsed per row at reset: the error names the row

    def __init__(
        self,
        dataset_name: str,
        split: str | None = None,
        question_key: str = "problem",
        test_key: str = "tests",
        max_tests: int = 12,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        format_penalty: float = 0.0,
        env_instruction: str = "",
        max_steps: int | None = None,
    ) -> None:
        if max_tests < 1:
            raise ConfigError(f"roll_code max_tests={max_tests} must be >= 1")
        super().__init__(dataset_name, split, question_key, test_key, format_penalty, env_instruction)
        self.max_tests = max_tests
        self.limits = SandboxLimits(timeout_s=timeout_s, cpu_s=timeout_s, memory_mb=memory_mb)
        self.tests: list[CodeTest] = []

    def reset(self, seed: int | None = None) -> ResetOutput:
        observation, info = super().reset(seed)
        where = f"{self.env_type}: {self.dataset_name} row {self.index}"
        value = self.row[self.answer_key]
        if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
            with contextlib.suppress(json.JSONDecodeError):  # else: Python source, assert statements
                value = json.loads(value)
        try:  # text or a list of strings: assert statements; anything else: stdin/stdout cases
            plain = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
            tests = parse_test_cases(tests=value) if plain else parse_test_cases(test_cases=value)
        except (ValueError, TypeError) as e:
            raise DataError(f"{where}: key {self.answer_key!r} holds no usable tests ({e}); fix the row") from None
        if not tests:
            raise DataError(f"{where}: key {self.answer_key!r} holds no tests; fix the row")
        if len(tests) > self.max_tests:  # the longest inputs, as GEM keeps them: they tend to be the hardest
            keep = sorted(range(len(tests)), key=lambda i: -len(tests[i].stdin))[: self.max_tests]
            tests = [tests[i] for i in sorted(keep)]
        self.tests = tests
        return observation, info

    def grade(self, response: str) -> tuple[bool, bool, str]:
        if extract_code(response) is None:
            return False, False, "no fenced code block"
        score, reason = code_score(response, self.tests, self.limits, partial_credit=False)
        return True, score == 1.0, reason
