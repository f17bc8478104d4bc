"""Procedural Sokoban rooms that are solvable by construction, and a breadth-first solver.

A room is carved by a random walk inside a walled rectangle; targets and the player are placed on its floor with
every box on a target. Playing *backwards* from that solved position (the player walks, optionally pulling the
box behind it) for up to ``search_depth`` moves and keeping the position whose boxes moved furthest gives the
puzzle: reversing the recorded moves pushes every box back onto its target, so a solution always exists. Of the
positions with the boxes equally far out, the one the most backward moves away is kept: the nearest one has the
player still standing where its last pull left it, one push from solved, whatever ``search_depth`` says.

Standard library only (roll's ConfigError where roll is installed): the ``sokoban_sandbox`` env's game server
runs a copy of this file inside its sandbox (:mod:`roll.agentic.env.sokoban_sandbox.app`).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

try:
    from roll.runtime import ConfigError
except ImportError:  # a copy of this file in sokoban_sandbox's app, run where roll is not installed
    ConfigError = ValueError  # type: ignore[misc,assignment]  # roll's ConfigError is a ValueError

__all__ = ["ACTION_DELTAS", "Room", "check_room_settings", "generate_room", "push", "solve"]

Cell = tuple[int, int]
WALL, FLOOR, TARGET = 0, 1, 2
ACTION_DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
_MAX_ROOM_TRIES = 200
_MAX_REVERSE_STATES = 50_000


@dataclass(frozen=True)
class Room:
    """A puzzle: fixed cells (``WALL``/``FLOOR``/``TARGET`` per cell), box positions and the player."""

    fixed: tuple[tuple[int, ...], ...]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def targets(self) -> frozenset[Cell]:
        return frozenset((r, c) for r, row in enumerate(self.fixed) for c, v in enumerate(row) if v == TARGET)

    def is_free(self, cell: Cell, boxes: frozenset[Cell]) -> bool:
        r, c = cell
        inside = 0 <= r < len(self.fixed) and 0 <= c < len(self.fixed[0])
        return inside and self.fixed[r][c] != WALL and cell not in boxes


def _carve(dim: tuple[int, int], rng: random.Random) -> list[list[int]]:
    """Floor cells from a random walk with occasional wide strokes; the border stays wall."""
    height, width = dim
    grid = [[WALL] * width for _ in range(height)]
    row, col = rng.randrange(1, height - 1), rng.randrange(1, width - 1)
    direction = rng.choice(list(ACTION_DELTAS.values()))
    strokes = [[(0, 0)], [(0, 0), (0, 1)], [(0, 0), (1, 0)], [(0, 0), (0, 1), (1, 0), (1, 1)]]
    for _ in range(math.ceil(1.7 * (height + width))):
        if rng.random() < 0.35:
            direction = rng.choice(list(ACTION_DELTAS.values()))
        row = min(max(row + direction[0], 1), height - 2)
        col = min(max(col + direction[1], 1), width - 2)
        for dr, dc in rng.choice(strokes):
            r, c = row + dr, col + dc
            if 1 <= r < height - 1 and 1 <= c < width - 1:
                grid[r][c] = FLOOR
    return grid


def _reverse_search(room: Room, box_ids: tuple[Cell, ...], depth: int, rng: random.Random) -> tuple[Room, int, int]:
    """The position reachable by at most ``depth`` backward moves whose boxes are furthest from their targets, and
    of those the one the most moves away (the first such in the shuffled breadth-first order); with its score (the
    boxes' distance from their targets) and its number of backward moves."""
    start = (room.player, box_ids)
    best, best_score, best_level = start, 0, 0
    seen = {(room.player, frozenset(box_ids))}
    queue = deque([(start, 0)])
    moves = list(ACTION_DELTAS.values())
    while queue and len(seen) < _MAX_REVERSE_STATES:
        (player, boxes), level = queue.popleft()
        score = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, box_ids))
        if score > best_score or (score == best_score > 0 and level > best_level):
            best, best_score, best_level = (player, boxes), score, level
        if level == depth:
            continue
        rng.shuffle(moves)
        occupied = frozenset(boxes)
        for dr, dc in moves:
            step = (player[0] + dr, player[1] + dc)
            if not room.is_free(step, occupied):
                continue
            behind = (player[0] - dr, player[1] - dc)
            options = [boxes]
            if behind in occupied:  # pulling: the box behind follows the player into its old cell
                options.append(tuple(player if b == behind else b for b in boxes))
            for new_boxes in options:
                key = (step, frozenset(new_boxes))
                if key not in seen:
                    seen.add(key)
                    queue.append(((step, new_boxes), level + 1))
    player, boxes = best
    return Room(room.fixed, frozenset(boxes), player), best_score, best_level


def check_room_settings(dim_room: tuple[int, int], num_boxes: int, search_depth: int) -> None:
    """ConfigError naming the setting when rooms of these settings cannot be generated at all."""
    height, width = dim_room
    if min(height, width) < 4 or max(height, width) < 5:  # 2x2 inside the walls: no room to pull a box
        raise ConfigError(
            f"sokoban dim_room={list(dim_room)} is too small: a box is pulled away from its target with three free "
            f"cells in a row inside the walls; use at least [4, 5]"
        )
    if num_boxes < 1 or search_depth < 1:
        raise ConfigError(f"sokoban needs num_boxes >= 1 and search_depth >= 1, got {num_boxes}, {search_depth}")


def generate_room(dim_room: tuple[int, int], num_boxes: int, search_depth: int, rng: random.Random) -> Room:
    """A solvable room of ``dim_room`` (rows, cols) with ``num_boxes`` boxes, at least one off its target."""
    check_room_settings(dim_room, num_boxes, search_depth)
    height, width = dim_room
    for _ in range(_MAX_ROOM_TRIES):
        grid = _carve(dim_room, rng)
        floor = [(r, c) for r in range(height) for c in range(width) if grid[r][c] == FLOOR]
        if len(floor) < num_boxes + 2:
            continue
        picked = rng.sample(floor, num_boxes + 1)
        targets, player = picked[:-1], picked[-1]
        for r, c in targets:
            grid[r][c] = TARGET
        solved = Room(tuple(tuple(row) for row in grid), frozenset(targets), player)
        room, score, level = _reverse_search(solved, tuple(targets), search_depth, rng)
        if score > 0 and level >= min(search_depth, 2):  # not a corridor where one push is all there is
            return room
    raise ConfigError(
        f"could not generate a sokoban room of {list(dim_room)} with {num_boxes} boxes in {_MAX_ROOM_TRIES} tries; "
        f"use a larger dim_room or fewer boxes"
    )


def push(room: Room, boxes: frozenset[Cell], player: Cell, action: str) -> tuple[Cell, frozenset[Cell], Cell | None]:
    """Forward move: ``(new_player, new_boxes, moved_box_destination_or_None)``; blocked moves change nothing."""
    dr, dc = ACTION_DELTAS[action]
    step = (player[0] + dr, player[1] + dc)
    if step in boxes:
        beyond = (step[0] + dr, step[1] + dc)
        if not room.is_free(beyond, boxes):
            return player, boxes, None
        return step, (boxes - {step}) | {beyond}, beyond
    if not room.is_free(step, boxes):
        return player, boxes, None
    return step, boxes, None


def solve(room: Room, max_depth: int = 200, max_states: int = 500_000) -> list[str] | None:
    """A shortest action sequence that puts every box on a target, or ``None`` within the search limits."""
    targets = room.targets
    start = (room.player, room.boxes)
    previous: dict[tuple[Cell, frozenset[Cell]], tuple | None] = {start: None}
    queue = deque([(start, 0)])
    while queue and len(previous) <= max_states:
        state, depth = queue.popleft()
        if state[1] <= targets:
            path = []
            while previous[state] is not None:
                state, action = previous[state]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        if depth == max_depth:
            continue
        for action in ACTION_DELTAS:
            player, boxes, _ = push(room, state[1], state[0], action)
            nxt = (player, boxes)
            if nxt not in previous:
                previous[nxt] = (state, action)
                queue.append((nxt, depth + 1))
    return None
