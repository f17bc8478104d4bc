"""Arithmetic questions answered in ``<answer>...</answer>``, optionally with tools (``tool_math``: a Python tool).

``arithmetic``: one question per episode, e.g. "What is 347 * 29?". A parsable answer ends the episode with reward
1 if it equals the result, else 0; a response without an answer earns ``format_penalty`` and the question is
asked again, until ``max_steps`` turns.

``tool_math``: the same env behind a :class:`~roll.agentic.tools.ToolEnvWrapper` with the ``python_code`` tool, so
a turn may be a ``<tool_call>`` whose result comes back as the next observation.
"""

from __future__ import annotations

import inspect
import random
import re
from typing import Any

from roll.agentic.env.base import Env, ResetOutput, StepOutput, check_split, draw_in_split
from roll.agentic.env.parsing import ACTION_PATTERN, parse_action
from roll.runtime import ConfigError

__all__ = ["ArithmeticEnv", "make_tool_math_env"]

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
INSTRUCTION = "Answer the arithmetic question. Give the final result as an integer in <answer>...</answer>."
_NUMBER = re.compile(r"^-?\d+$")
_SAMPLER = random.Random()  # unseeded random actions (a request without a seed)


def _evaluate(operands: list[int], ops: list[str]) -> int:
    """The value with the usual precedence: products first, then sums and differences left to right."""
    terms, signs = [operands[0]], []
    for op, value in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= value
        else:
            terms.append(value)
            signs.append(op)
    total = terms[0]
    for sign, value in zip(signs, terms[1:]):
        total = _OPS[sign](total, value)
    return total


def _expression(question: tuple[list[int], list[str]]) -> str:
    operands, ops = question
    return " ".join(p for pair in zip([str(o) for o in operands], [*ops, ""]) for p in pair if p)


class ArithmeticEnv(Env):
    """Integer arithmetic with ``digits``-digit operands and ``num_operands`` terms over ``operators``."""

    def __init__(
        self,
        digits: int = 2,
        num_operands: int = 2,
        operators: str = "+-*",
        max_steps: int = 3,
        format_penalty: float = 0.0,
        action_pattern: str = ACTION_PATTERN,
        env_instruction: str | None = None,
        split: str | None = None,
        val_fraction: float = 0.2,
    ) -> None:
        check_split("arithmetic", split, val_fraction)
        self.split, self.val_fraction = split, val_fraction
        if digits < 1 or num_operands < 2:
            raise ConfigError(f"arithmetic needs digits >= 1 and num_operands >= 2, got {digits}, {num_operands}")
        unknown = sorted(set(operators) - set(_OPS))
        if unknown or not operators:
            raise ConfigError(f"arithmetic operators={operators!r}: use a non-empty subset of '+-*'")
        self.digits, self.num_operands, self.operators = digits, num_operands, operators
        self.max_steps, self.format_penalty, self.action_pattern = max_steps, format_penalty, action_pattern
        self.env_instruction = env_instruction or INSTRUCTION
        self.question = ""
        self.answer = 0
        self.steps = 0

    def reset(self, seed: int | None = None) -> ResetOutput:
        rng = random.Random(seed)
        settings = f"arithmetic digits={self.digits} num_operands={self.num_operands} operators={self.operators!r}"
        operands, ops = draw_in_split(lambda: self._draw(rng), _expression, self.split, self.val_fraction, settings)
        expression = _expression((operands, ops))
        self.answer = _evaluate(operands, ops)
        self.question = f"What is {expression}?"
        self.steps = 0
        return self.question, {"env_instruction": self.env_instruction, "success": False, "answer": self.answer}

    def _draw(self, rng: random.Random) -> tuple[list[int], list[str]]:
        low, high = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits - 1
        operands = [rng.randint(low, high) for _ in range(self.num_operands)]
        return operands, [rng.choice(self.operators) for _ in range(self.num_operands - 1)]

    def step(self, action: str) -> StepOutput:
        self.steps += 1
        parsed = parse_action(action, self.action_pattern)
        content = parsed.content.replace(",", "").strip()
        valid = parsed.valid and bool(_NUMBER.match(content))
        info: dict[str, Any] = {"action_is_valid": valid, "action_content": parsed.content}
        if not valid:
            truncated = self.steps >= self.max_steps
            info["success"] = False
            message = "Your response has no integer answer in <answer>...</answer>. " + self.question
            return message, self.format_penalty, False, truncated, info
        correct = int(content) == self.answer
        info["success"] = correct
        observation = "Correct." if correct else f"Incorrect: the answer is {self.answer}."
        return observation, 1.0 if correct else 0.0, True, False, info

    def sample_random_action(self, seed: int | None = None) -> str:
        """A random integer answer: a function of ``seed`` (the turn's), else drawn from an unseeded generator (never
        the process-global ``random``, which other code may have seeded)."""
        rng = random.Random(seed) if seed is not None else _SAMPLER
        return f"<answer>{rng.randint(-(10**self.digits), 10 ** (2 * self.digits))}</answer>"


def make_tool_math_env(
    tool_configs: list[dict[str, Any]] | None = None,
    wrapper_args: dict[str, Any] | None = None,
    **env_config: Any,
) -> Env:
    """``tool_math``: :class:`ArithmeticEnv` with tools (default: ``python_code``) behind a ToolEnvWrapper."""
    from roll.agentic.tools.wrapper import tool_wrapper

    configs = tool_configs if tool_configs is not None else [{"tool_id": "python_code"}]
    return tool_wrapper(ArithmeticEnv(**env_config), wrapper_args or {}, configs)


# Its keys are ArithmeticEnv's and the wrapper's: a signature that says so lets make_env and roll validate name a
# misspelled key (the **env_config above would take anything).
make_tool_math_env.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *[p for name, p in inspect.signature(make_tool_math_env).parameters.items() if name != "env_config"],
        *[p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(ArithmeticEnv).parameters.values()],
    ]
)
