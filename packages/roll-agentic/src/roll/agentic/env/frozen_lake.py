"""FrozenLake as a text game: walk from the start to the goal without falling into a hole.

Maps are random and always solvable (a hole-free 4-connected path joins start and goal); the map, and on
slippery ice every slip, come from the episode's seed, so an episode is a pure function of (seed, actions).
Slippery ice follows gymnasium's rule: the intended move with probability 1/3, each perpendicular one with 1/3.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from roll.agentic.env.base import Env, ResetOutput, StepOutput, check_split, draw_in_split, grid_lookup_of
from roll.agentic.env.parsing import ACTION_PATTERN, parse_action
from roll.runtime import ConfigError

__all__ = ["MOVES", "FrozenLakeEnv", "generate_frozen_lake_map", "read_board", "shortest_path"]

Cell = tuple[int, int]
_SAMPLER = random.Random()
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
_PERPENDICULAR = {"Left": ("Up", "Down"), "Right": ("Up", "Down"), "Up": ("Left", "Right"), "Down": ("Left", "Right")}
# Symbols of the rendered grid: ROLL's defaults.
GRID_LOOKUP = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
GRID_VOCAB = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}
INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Avoid the holes and reach the goal. "
    "The answer must be one action per turn, in the format <answer>Right</answer>."
)


def shortest_path(board: list[str], start: Cell, goal: Cell) -> list[str] | None:
    """Actions of a shortest hole-free path from ``start`` to ``goal`` on ``board`` ("F", "H", "S", "G" rows)."""
    size = len(board)
    previous: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while previous[cell] is not None:
                cell, action = previous[cell]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        for action, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in previous and board[nxt[0]][nxt[1]] != "H":
                previous[nxt] = (cell, action)
                queue.append(nxt)
    return None


def read_board(grid: list[str], grid_lookup: dict[int, str] | None = None) -> tuple[list[str], Cell, Cell] | None:
    """A rendered ``grid`` (symbols of ``grid_lookup``, default ROLL's) as ("S", "F", "H", "G") rows with the player's
    and the goal's cells, or None when either is gone (the player in a hole or on the goal)."""
    lookup = grid_lookup_of(grid_lookup, GRID_LOOKUP)
    player, hole, goal_symbol = lookup[0], lookup[2], lookup[3]
    board = [
        "".join("S" if c == player else "H" if c == hole else "G" if c == goal_symbol else "F" for c in row)
        for row in grid
    ]
    start = next(((r, row.index("S")) for r, row in enumerate(board) if "S" in row), None)
    goal = next(((r, row.index("G")) for r, row in enumerate(board) if "G" in row), None)
    if start is None or goal is None:
        return None
    return board, start, goal


def generate_frozen_lake_map(size: int, p: float, rng: random.Random) -> list[str]:
    """A solvable ``size`` x ``size`` board: each cell frozen with probability ``p``, random start and goal."""
    while True:
        board = [["F" if rng.random() < p else "H" for _ in range(size)] for _ in range(size)]
        start = (rng.randrange(size), rng.randrange(size))
        goal = (rng.randrange(size), rng.randrange(size))
        if start == goal:
            continue
        board[start[0]][start[1]], board[goal[0]][goal[1]] = "S", "G"
        rows = ["".join(row) for row in board]
        if shortest_path(rows, start, goal) is not None:
            return rows


class FrozenLakeEnv(Env):
    """FrozenLake with ROLL's configuration keys (``size``, ``p``, ``is_slippery``, ``map_seed``, ``max_steps``,
    ``format_penalty``, ``action_pattern``, ``grid_lookup``, ``grid_vocab``, ``env_instruction``), plus ``split``
    (``"train"``/``"val"``: draw only layouts of that split, see :func:`layout_split`; None: any layout).

    Reward 1 on reaching the goal, 0 otherwise, ``format_penalty`` for a response without a valid action (the
    player does not move). Falling into a hole or reaching the goal terminates; ``max_steps`` actions truncate.
    """

    ACTIONS = ("Left", "Down", "Right", "Up")

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        map_seed: int | None = None,
        max_steps: int = 20,
        format_penalty: float = 0.0,
        action_pattern: str = ACTION_PATTERN,
        grid_lookup: dict[int, str] | None = None,
        grid_vocab: dict[str, str] | None = None,
        env_instruction: str | None = None,
        render_mode: str = "text",
        split: str | None = None,
        val_fraction: float = 0.2,
    ) -> None:
        check_split("frozen_lake", split, val_fraction)
        self.split, self.val_fraction = split, val_fraction
        if size < 2:
            raise ConfigError(f"frozen_lake size={size} is too small; use size >= 2")
        if not 0 < p <= 1:
            raise ConfigError(f"frozen_lake p={p} is not valid; it is the probability of a frozen cell, in (0, 1]")
        if render_mode != "text":
            raise ConfigError(f"frozen_lake render_mode={render_mode!r}: only 'text' is supported")
        self.size, self.p, self.is_slippery = size, p, is_slippery
        self.map_seed, self.max_steps, self.format_penalty = map_seed, max_steps, format_penalty
        self.action_pattern = action_pattern
        parse_action("", action_pattern)  # a bad pattern is a ConfigError here, not a fault at every step
        self.grid_lookup = grid_lookup_of(grid_lookup, GRID_LOOKUP)
        self.grid_vocab = dict(GRID_VOCAB if grid_vocab is None else grid_vocab)  # {}: no legend
        self.env_instruction = env_instruction or INSTRUCTION
        self.board: list[str] = []
        self.player: Cell = (0, 0)
        self.goal: Cell = (0, 0)
        self.steps = 0
        self._rng = random.Random(0)

    # --- state ------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> ResetOutput:
        self._rng = random.Random(seed)
        map_rng = random.Random(self.map_seed) if self.map_seed is not None else self._rng
        self.board = draw_in_split(
            lambda: generate_frozen_lake_map(self.size, self.p, map_rng),
            "\n".join,
            self.split if self.map_seed is None else None,  # one fixed map: no split to draw from
            self.val_fraction,
            f"frozen_lake size={self.size} p={self.p}",
        )
        self.player = self._find("S")
        self.goal = self._find("G")
        self.steps = 0
        return self.render(), {"env_instruction": self.instructions(), "success": False}

    def _find(self, symbol: str) -> Cell:
        for r, row in enumerate(self.board):
            if symbol in row:
                return r, row.index(symbol)
        raise AssertionError(f"no {symbol} on the board")  # generate_frozen_lake_map always places S and G

    def _cell(self, cell: Cell) -> str:
        return self.board[cell[0]][cell[1]]

    @property
    def success(self) -> bool:
        return self.player == self.goal

    def solution(self) -> list[str]:
        """A shortest action sequence from the current position (non-slippery ice reaches the goal with it)."""
        path = shortest_path(self.board, self.player, self.goal)
        return path or []

    # --- dynamics ---------------------------------------------------------------------------------------
    def _move(self, action: str) -> None:
        if self.is_slippery:
            action = self._rng.choice((action, *_PERPENDICULAR[action]))
        dr, dc = MOVES[action]
        row = min(max(self.player[0] + dr, 0), self.size - 1)
        col = min(max(self.player[1] + dc, 0), self.size - 1)
        self.player = (row, col)

    def step(self, action: str) -> StepOutput:
        self.steps += 1
        parsed = parse_action(action, self.action_pattern, self.ACTIONS)
        info: dict[str, Any] = {"action_is_valid": parsed.valid, "action_content": parsed.content}
        if not parsed.valid:
            reward, terminated, effective = self.format_penalty, False, False
        else:
            before = self.player
            self._move(parsed.action)  # type: ignore[arg-type]
            effective = self.player != before
            fell = self._cell(self.player) == "H"
            reward, terminated = (1.0 if self.success else 0.0), self.success or fell
        truncated = not terminated and self.steps >= self.max_steps
        info.update(success=self.success, action_is_effective=effective)
        info["metrics"] = {"action_is_valid": float(parsed.valid), "action_is_effective": float(effective)}
        return self.render(), reward, terminated, truncated, info

    # --- text -------------------------------------------------------------------------------------------
    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.board):
            cells = []
            for c, symbol in enumerate(row):
                if (r, c) == self.player:
                    code = 4 if symbol == "H" else 5 if symbol == "G" else 0
                else:
                    code = {"H": 2, "G": 3}.get(symbol, 1)
                cells.append(self.grid_lookup.get(code, "?"))
            rows.append("".join(cells))
        return "\n".join(rows)

    def instructions(self) -> str:
        vocab = ", ".join(f"{k}: {v}" for k, v in self.grid_vocab.items())
        legend = f"\nThe meaning of each symbol in the state is:\n{vocab}" if vocab else ""  # grid_vocab {}: none
        return f"{self.env_instruction}{legend}\nYour available actions are:\n{', '.join(self.ACTIONS)}"

    def sample_random_action(self, seed: int | None = None) -> str:
        """A uniformly random move: a function of ``seed`` (the turn's), else drawn from an unseeded generator.
        Never the episode's own generator: sampling must not shift its (seeded) slips."""
        rng = random.Random(seed) if seed is not None else _SAMPLER
        return f"<answer>{rng.choice(self.ACTIONS)}</answer>"
