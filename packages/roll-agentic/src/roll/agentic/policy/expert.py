"""Scripted experts: text policies (for :class:`~roll.agentic.policy.MockPolicyClient`) that read the current
observation out of the prompt and answer with a planner's action, or a random one with probability ``noise``.

Used for warm-up data (behaviour cloning before RL, ``warmup.policy``) and as reference policies in tests.
"""

from __future__ import annotations

import json
import random
import re

from roll.agentic.env.base import grid_lookup_of
from roll.agentic.env.frozen_lake import GRID_LOOKUP, read_board, shortest_path
from roll.runtime import ConfigError

__all__ = ["FrozenLakeExpert", "SokobanExpert", "ToolMathExpert", "is_rectangle", "is_square", "last_grid"]

_ACTIONS = ("Left", "Down", "Right", "Up")


def is_rectangle(lines: list[str]) -> bool:
    """Whether ``lines`` form a block with every row as wide (a rendered Sokoban room)."""
    return bool(lines) and all(len(line) == len(lines[0]) for line in lines)


def is_square(lines: list[str]) -> bool:
    """Whether ``lines`` form a square block (as many rows as columns, every row as wide): a rendered grid."""
    return is_rectangle(lines) and len(lines) == len(lines[0])


def last_grid(text: str, symbols: str, square: bool = True) -> list[str] | None:
    """The last block of lines made only of ``symbols`` in ``text`` (the latest observation), or None: a square
    block, or with ``square=False`` any block of two or more rows as wide as each other (Sokoban's rooms)."""
    cls = "[" + re.escape(symbols) + "]"
    found = None
    for match in re.finditer(f"{cls}+(?:\n{cls}+)+", text):
        lines = match.group(0).split("\n")
        if (is_square if square else is_rectangle)(lines):
            found = lines
    return found


class FrozenLakeExpert:
    """Shortest-path moves on the rendered FrozenLake grid (ROLL's default symbols); ``noise``: random moves."""

    def __init__(self, noise: float = 0.0, grid_lookup: dict[int, str] | None = None) -> None:
        if not 0 <= noise <= 1:
            raise ConfigError(f"FrozenLakeExpert noise={noise} must be in [0, 1]")
        self.noise = noise
        self.lookup = grid_lookup_of(grid_lookup, GRID_LOOKUP)
        self.symbols = "".join(self.lookup.values())

    def action(self, grid: list[str]) -> str | None:
        """The planner's move on ``grid``, or None when the player is not on the board (in a hole, at the goal)."""
        found = read_board(grid, self.lookup)
        path = shortest_path(*found) if found is not None else None
        return path[0] if path else None

    def __call__(self, prompt: str, rng: random.Random) -> str:
        grid = last_grid(prompt, self.symbols)
        planned = self.action(grid) if grid is not None else None
        if planned is None or rng.random() < self.noise:
            planned = rng.choice(_ACTIONS)
        return f"<answer>{planned}</answer>"


class SokobanExpert:
    """The first move of a shortest Sokoban solution (BFS over the rendered room); ``noise``: random moves."""

    def __init__(self, noise: float = 0.0, grid_lookup: dict[int, str] | None = None, max_depth: int = 60) -> None:
        from roll.agentic.env.sokoban import GRID_LOOKUP as SOKOBAN_LOOKUP

        if not 0 <= noise <= 1:
            raise ConfigError(f"SokobanExpert noise={noise} must be in [0, 1]")
        self.noise, self.max_depth = noise, max_depth
        self.lookup = grid_lookup_of(grid_lookup, SOKOBAN_LOOKUP)
        self.symbols = "".join(self.lookup.values())

    def action(self, grid: list[str]) -> str | None:
        """The first move of a shortest solution on ``grid``, or None (no player, or none within ``max_depth``)."""
        from roll.agentic.env.sokoban import read_room
        from roll.agentic.env.sokoban_gen import solve

        room = read_room(grid, self.lookup)
        plan = solve(room, max_depth=self.max_depth) if room is not None else None
        return plan[0] if plan else None

    def __call__(self, prompt: str, rng: random.Random) -> str:
        grid = last_grid(prompt, self.symbols, square=False)
        planned = self.action(grid) if grid is not None else None
        if planned is None or rng.random() < self.noise:
            planned = rng.choice(("Up", "Down", "Left", "Right"))
        return f"<answer>{planned}</answer>"


_CALL_END = "</tool_call>"


class ToolMathExpert:
    """For ``tool_math``: call the python tool on the question, then answer with the tool's output. With
    probability ``noise`` it answers at once without the tool, off by a random amount (an unreliable mental sum)."""

    _QUESTION = re.compile(r"What is ([-\d+*\s]+)\?")

    def __init__(self, noise: float = 0.0) -> None:
        if not 0 <= noise <= 1:
            raise ConfigError(f"ToolMathExpert noise={noise} must be in [0, 1]")
        self.noise = noise

    def __call__(self, prompt: str, rng: random.Random) -> str:
        questions = self._QUESTION.findall(prompt)
        if not questions:
            return "<answer>0</answer>"
        expression = questions[-1].strip()
        # What follows its own last call is the tool's answer, however the chat template wraps a tool message
        # (ChatML's tool role, Qwen's <tool_response> in a user turn, ...)
        call_end = prompt.rfind(_CALL_END)
        found = re.findall(r"-?\d+", prompt[call_end + len(_CALL_END) :]) if call_end >= 0 else []
        if found:
            return f"<answer>{found[-1]}</answer>"
        if rng.random() < self.noise:
            value = eval(expression, {"__builtins__": {}})  # digits and + - * only (matched above)
            return f"<answer>{value + rng.choice((-10, -2, -1, 1, 2, 10))}</answer>"
        code = json.dumps({"name": "python_code", "arguments": {"code": f"print({expression})"}})
        return f"<tool_call>{code}</tool_call>"
