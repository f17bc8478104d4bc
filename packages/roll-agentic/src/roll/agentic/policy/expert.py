"""Scripted experts: text policies (for :class:`~roll.agentic.policy.MockPolicyClient`) that read the current
observation out of the prompt and answer with a planner's action, or a random one with probability ``noise``.

Used for warm-up data (behaviour cloning before RL, ``warmup.policy``) and as reference policies in tests.
"""

from __future__ import annotations

import random
import re

from roll.agentic.env.frozen_lake import GRID_LOOKUP, shortest_path
from roll.runtime import ConfigError

__all__ = ["FrozenLakeExpert", "last_grid"]

_ACTIONS = ("Left", "Down", "Right", "Up")


def last_grid(text: str, symbols: str) -> list[str] | None:
    """The last square block of lines made only of ``symbols`` in ``text`` (the latest observation), or None."""
    cls = "[" + re.escape(symbols) + "]"
    found = None
    for match in re.finditer(f"{cls}+(?:\n{cls}+)+", text):
        lines = match.group(0).split("\n")
        width = len(lines[0])
        if len(lines) == width and all(len(line) == width for line in lines):
            found = lines
    return found


class FrozenLakeExpert:
    """Shortest-path moves on the rendered FrozenLake grid (ROLL's default symbols); ``noise``: random moves."""

    def __init__(self, noise: float = 0.0, grid_lookup: dict[int, str] | None = None) -> None:
        if not 0 <= noise <= 1:
            raise ConfigError(f"FrozenLakeExpert noise={noise} must be in [0, 1]")
        self.noise = noise
        lookup = {int(k): v for k, v in (grid_lookup or GRID_LOOKUP).items()}
        self.player, self.empty, self.hole, self.goal = lookup[0], lookup[1], lookup[2], lookup[3]
        self.symbols = "".join(lookup.values())

    def action(self, grid: list[str]) -> str | None:
        """The planner's move on ``grid``, or None when the player is not on the board (in a hole, at the goal)."""
        board = [
            "".join(
                "S" if c == self.player else "H" if c == self.hole else "G" if c == self.goal else "F" for c in row
            )
            for row in grid
        ]
        start = next(((r, row.index("S")) for r, row in enumerate(board) if "S" in row), None)
        goal = next(((r, row.index("G")) for r, row in enumerate(board) if "G" in row), None)
        if start is None or goal is None:
            return None
        path = shortest_path(board, start, goal)
        return path[0] if path else None

    def __call__(self, prompt: str, rng: random.Random) -> str:
        grid = last_grid(prompt, self.symbols)
        planned = self.action(grid) if grid is not None else None
        if planned is None or rng.random() < self.noise:
            planned = rng.choice(_ACTIONS)
        return f"<answer>{planned}</answer>"
