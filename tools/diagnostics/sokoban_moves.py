"""Does a Sokoban policy plan? Grades every move of dumped rollouts against the room it was made in, and measures
what held-out rooms give a policy that does not (docs/results/agentic.md 53).

Usage:
  python -m tools.diagnostics.sokoban_moves ROLLOUT_FILE [ROLLOUT_FILE ...]
  python -m tools.diagnostics.sokoban_moves --rooms [ROWS COLS BOXES SEARCH_DEPTH MOVES ROOMS]
ROLLOUT_FILE: a ``<name>.jsonl`` written by the agentic pipeline with ``rollout.dump=true`` (e.g.
``<output_dir>/rollouts/val-step-000000.jsonl``). Each answer is paired with the last room shown before it; a move is
*optimal* when it shortens the room's shortest solution by one move. Printed per file: the moves graded, the share
optimal, the share unparsable (inside the tags but not one of the four moves; a reply without both tags is not
paired, so not graded: read val/format for those), and a uniform random mover's optimal share on the very same rooms.
``--rooms`` (defaults 5 5 1 6 8 1000: agentic-sokoban-tiny's rooms): plays ROOMS rooms of the "val" split (seeds from
10000) with a uniform random mover, MOVES moves each, and prints its success rate, the noise-free planner's (rooms
with a shortest solution within MOVES) and the shortest solutions' median, 90th percentile and share of one-move
rooms.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from roll.agentic.env.sokoban import GRID_LOOKUP, SokobanEnv, read_room
from roll.agentic.env.sokoban_gen import ACTION_DELTAS, Room, push, solve
from tools.diagnostics.frozenlake_moves import format_stats, grid_answers

FIRST_SEED = 10_000


def grade(grid: list[str]) -> dict[str, bool] | None:
    """Per move: whether it shortens the shortest solution by one; None without a player or a solution."""
    room = read_room(grid)
    path = solve(room) if room is not None else None
    if room is None or not path:
        return None
    out = {}
    for move in ACTION_DELTAS:
        player, boxes, _ = push(room, room.boxes, room.player, move)
        rest = solve(Room(room.fixed, boxes, player), max_depth=len(path))
        out[move] = rest is not None and len(rest) == len(path) - 1
    return out


def report(path: Path) -> dict[str, float]:
    answered = []
    for line in path.open():
        row = json.loads(line)
        for grid, answer in grid_answers(row["prompt"] + row["response"], "".join(GRID_LOOKUP.values()), False):
            table = grade(grid)
            if table is not None:
                answered.append((table, answer))
    n = max(len(answered), 1)
    return {
        "moves": float(len(answered)),
        "optimal": sum(table.get(answer, False) for table, answer in answered) / n,
        "unparsable": sum(answer not in table for table, answer in answered) / n,
        "random_optimal": sum(sum(table.values()) / 4 for table, _ in answered) / n,
    }


def room_baselines(
    dim_room: tuple[int, int] = (5, 5), num_boxes: int = 1, search_depth: int = 6, moves: int = 8, rooms: int = 1000
) -> dict[str, float]:
    """Success of a uniform random mover and of the noise-free planner (a shortest solution within ``moves``) on
    held-out rooms, and the rooms' shortest solutions (median, 90th percentile, share needing one move)."""
    rng = random.Random(0)
    env = SokobanEnv(dim_room, num_boxes, search_depth, max_steps=moves, split="val")
    solved, lengths = 0, []
    for i in range(rooms):
        env.reset(seed=FIRST_SEED + i)
        plan = env.solution()
        lengths.append(len(plan) if plan is not None else moves + 1)
        for _ in range(moves):
            _, _, terminated, truncated, _ = env.step(f"<answer>{rng.choice(SokobanEnv.ACTIONS)}</answer>")
            if terminated or truncated:
                break
        solved += env.success
    lengths.sort()
    return {
        "random_mover": solved / rooms,
        "planner": sum(n <= moves for n in lengths) / rooms,
        "median_solution": float(lengths[rooms // 2]),
        "p90_solution": float(lengths[int(rooms * 0.9)]),
        "one_move_rooms": sum(n == 1 for n in lengths) / rooms,
    }


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    if argv[0] == "--rooms":
        rows, cols, boxes, depth, moves, rooms = (int(a) for a in (argv[1:] or ["5", "5", "1", "6", "8", "1000"]))
        stats = room_baselines((rows, cols), boxes, depth, moves, rooms)
        print(f"{rooms} held-out rooms {rows}x{cols}, {boxes} box(es), search_depth {depth}, {moves} moves")
        print(format_stats(stats))
        return
    for name in argv:
        print(name)
        print(format_stats(report(Path(name))))


if __name__ == "__main__":
    main(sys.argv[1:])
