"""Sokoban as a text game: push every box onto a target.

Rooms come from :mod:`roll.agentic.env.sokoban_gen` (solvable by construction) with the episode's seed; the
rewards are gym-sokoban's: -0.1 per move, +1 for a box pushed onto a target, -1 for one pushed off, +10 when all
boxes are on targets (which terminates). ``max_steps`` moves truncate.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Iterable, Mapping
from typing import Any

from roll.agentic.env.base import Env, ResetOutput, StepOutput, check_split, draw_in_split, grid_lookup_of
from roll.agentic.env.parsing import ACTION_PATTERN, parse_action
from roll.agentic.env.sokoban_gen import FLOOR, TARGET, WALL, Room, check_room_settings, generate_room, push, solve
from roll.runtime import ConfigError

__all__ = ["SokobanEnv", "read_room", "sokoban_instructions"]

# Symbols of the rendered grid (ROLL's defaults): cell code -> symbol, and symbol -> meaning.
GRID_LOOKUP = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
GRID_VOCAB = {
    "#": "wall",
    "_": "empty",
    "O": "target",
    "√": "box on target",
    "X": "box",
    "P": "player",
    "S": "player on target",
}
INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The answer must be one action per turn, in the format <answer>Right</answer>."
)
STEP_PENALTY, BOX_ON_REWARD, BOX_OFF_PENALTY, FINISH_REWARD = -0.1, 1.0, -1.0, 10.0
_SAMPLER = random.Random()


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def read_room(grid: list[str], grid_lookup: dict[int, str] | None = None) -> Room | None:
    """A rendered ``grid`` (symbols of ``grid_lookup``, default ROLL's) as a :class:`Room`, or None without a
    player; unknown symbols read as walls."""
    code = {symbol: c for c, symbol in grid_lookup_of(grid_lookup, GRID_LOOKUP).items()}
    fixed, boxes, player = [], set(), None
    for r, row in enumerate(grid):
        cells = []
        for c, symbol in enumerate(row):
            kind = code.get(symbol, 0)
            cells.append(WALL if kind == 0 else TARGET if kind in (2, 3, 6) else FLOOR)
            if kind in (3, 4):
                boxes.add((r, c))
            if kind in (5, 6):
                player = (r, c)
        fixed.append(tuple(cells))
    return None if player is None else Room(tuple(fixed), frozenset(boxes), player)


def sokoban_instructions(env_instruction: str, grid_vocab: Mapping[str, str], actions: Iterable[str]) -> str:
    """The rules, the symbols' legend (none for an empty ``grid_vocab``) and the actions, as ROLL words them."""
    vocab = ", ".join(f"{k}: {v}" for k, v in grid_vocab.items())
    legend = f"\nThe meaning of each symbol in the state is:\n{vocab}" if vocab else ""
    return f"{env_instruction}{legend}\nYour available actions are:\n{', '.join(actions)}"


class SokobanEnv(Env):
    """Sokoban with ROLL's configuration keys (``dim_room``, ``num_boxes``, ``search_depth``, ``max_steps``,
    ``format_penalty``, ``action_pattern``, ``grid_lookup``, ``grid_vocab``, ``env_instruction``)."""

    ACTIONS = ("Up", "Down", "Left", "Right")

    def __init__(
        self,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 30,
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
        check_split("sokoban", split, val_fraction)
        self.split, self.val_fraction = split, val_fraction
        if not isinstance(dim_room, list | tuple) or len(dim_room) != 2 or not all(_is_int(v) for v in dim_room):
            raise ConfigError(f"sokoban dim_room={dim_room!r} must be [rows, cols], two integers")
        if render_mode != "text":
            raise ConfigError(f"sokoban render_mode={render_mode!r}: only 'text' is supported")
        self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        # here, not at the first reset, where it would end every episode as an env fault
        check_room_settings(self.dim_room, num_boxes, search_depth)
        self.num_boxes, self.search_depth, self.max_steps = num_boxes, search_depth, max_steps
        self.format_penalty, self.action_pattern = format_penalty, action_pattern
        parse_action("", action_pattern)  # a bad pattern is a ConfigError here, not a fault at every step
        self.grid_lookup = grid_lookup_of(grid_lookup, GRID_LOOKUP)
        self.grid_vocab = dict(GRID_VOCAB if grid_vocab is None else grid_vocab)  # {}: no legend
        self.env_instruction = env_instruction or INSTRUCTION
        self.room: Room | None = None
        self.boxes: frozenset[tuple[int, int]] = frozenset()
        self.player = (0, 0)
        self.steps = 0

    def reset(self, seed: int | None = None) -> ResetOutput:
        rng = random.Random(seed)
        settings = f"sokoban dim_room={list(self.dim_room)} num_boxes={self.num_boxes} search_depth={self.search_depth}"
        self.room = draw_in_split(
            lambda: generate_room(self.dim_room, self.num_boxes, self.search_depth, rng),
            self._render_room,
            self.split,
            self.val_fraction,
            settings,
        )
        self.boxes, self.player, self.steps = self.room.boxes, self.room.player, 0
        return self.render(), {"env_instruction": self.instructions(), "success": False}

    @property
    def success(self) -> bool:
        return self.room is not None and self.boxes <= self.room.targets

    def solution(self, max_depth: int = 200) -> list[str] | None:
        """A shortest solution from the current position (``None`` if the search limits are hit)."""
        assert self.room is not None, "reset() first"
        return solve(Room(self.room.fixed, self.boxes, self.player), max_depth=max_depth)

    def step(self, action: str) -> StepOutput:
        if self.room is None:
            raise RuntimeError("SokobanEnv.step() before reset()")
        self.steps += 1
        parsed = parse_action(action, self.action_pattern, self.ACTIONS)
        reward, effective = STEP_PENALTY, False
        if not parsed.valid:
            reward += self.format_penalty
        else:
            targets = self.room.targets
            before = self.player
            on_before = len(self.boxes & targets)
            self.player, self.boxes, _ = push(self.room, self.boxes, self.player, parsed.action)  # type: ignore[arg-type]
            on_after = len(self.boxes & targets)
            reward += BOX_ON_REWARD * max(0, on_after - on_before) + BOX_OFF_PENALTY * max(0, on_before - on_after)
            effective = self.player != before
            if self.success:
                reward += FINISH_REWARD
        terminated = self.success
        truncated = not terminated and self.steps >= self.max_steps
        info: dict[str, Any] = {
            "action_is_valid": parsed.valid,
            "action_content": parsed.content,
            "action_is_effective": effective,
            "success": self.success,
            "metrics": {"action_is_valid": float(parsed.valid), "action_is_effective": float(effective)},
        }
        return self.render(), reward, terminated, truncated, info

    def render(self) -> str:
        assert self.room is not None, "reset() first"
        return self._grid(self.room, self.player, self.boxes)

    def _render_room(self, room: Room) -> str:
        """``room`` in ROLL's default symbols (the text its split is decided by): the split of a layout must not
        depend on ``grid_lookup``, or a train tag and a val tag with different symbols would share layouts."""
        return self._grid(room, room.player, room.boxes, GRID_LOOKUP)

    def _grid(
        self,
        room: Room,
        player: tuple[int, int],
        boxes: frozenset[tuple[int, int]],
        grid_lookup: dict[int, str] | None = None,
    ) -> str:
        lookup = self.grid_lookup if grid_lookup is None else grid_lookup
        rows = []
        for r, row in enumerate(room.fixed):
            cells = []
            for c, fixed in enumerate(row):
                cell = (r, c)
                if cell == player:
                    code = 6 if fixed == TARGET else 5
                elif cell in boxes:
                    code = 3 if fixed == TARGET else 4
                else:
                    code = 0 if fixed == WALL else 2 if fixed == TARGET else 1
                cells.append(lookup.get(code, "?"))
            rows.append("".join(cells))
        return "\n".join(rows)

    def instructions(self) -> str:
        return sokoban_instructions(self.env_instruction, self.grid_vocab, self.ACTIONS)

    def sample_random_action(self, seed: int | None = None) -> str:
        """A uniformly random move: a function of ``seed`` (the turn's), else drawn from an unseeded generator."""
        rng = random.Random(seed) if seed is not None else _SAMPLER
        return f"<answer>{rng.choice(self.ACTIONS)}</answer>"
