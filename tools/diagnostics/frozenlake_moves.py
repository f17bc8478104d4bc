"""Does a FrozenLake policy read the grid? Grades every move of dumped rollouts against the board it was made on.

Usage: python -m tools.diagnostics.frozenlake_moves ROLLOUT_FILE [ROLLOUT_FILE ...]
  ROLLOUT_FILE: a ``<name>.jsonl`` written by the agentic pipeline with ``rollout.dump=true`` (e.g.
  ``<output_dir>/rollouts/val-step-000000.jsonl``; one row per episode for trajectory-wise managers, one per turn for
  step-wise ones).

Each answer is paired with the last grid shown before it. A move is *optimal* when it lowers the hole-free distance
to the goal by one (it is on some shortest path); *into a hole* when it steps onto a hole. Printed per file: the
moves graded, the share optimal, the share into a hole, unparsable answers, the first two shares for a uniform random
mover on the very same boards, per move M the share of the boards where M falls into a hole on which the answer was M
(``hole_M``: does the policy see the hole on that side? A uniform mover: 0.25), and the first two shares for a
planner with ``noise`` 0.5 (half planner, half random: what the recipes' warm-ups cloned until section 14 of
docs/results/agentic.md; they now clone the noise-free planner, optimal on every move), so the policy's numbers read
against chance and against a half-random imitation.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from roll.agentic.env.frozen_lake import GRID_LOOKUP, MOVES, read_board, shortest_path
from roll.agentic.policy.expert import is_rectangle, is_square

DEMONSTRATOR_NOISE = 0.5


def grade(grid: list[str]) -> dict[str, tuple[bool, bool]] | None:
    """Per move: (optimal, into a hole); None when the player is not on a free cell or the goal is unreachable."""
    found = read_board(grid)
    if found is None:
        return None
    board, here, goal = found
    path = shortest_path(board, here, goal)
    if path is None:
        return None
    size, out = len(board), {}
    for move, (dr, dc) in MOVES.items():
        cell = (min(max(here[0] + dr, 0), size - 1), min(max(here[1] + dc, 0), size - 1))
        hole = board[cell[0]][cell[1]] == "H"
        rest = None if hole else shortest_path(board, cell, goal)
        out[move] = (rest is not None and len(rest) == len(path) - 1, hole)
    return out


def grid_answers(text: str, symbols: str, square: bool = True) -> list[tuple[list[str], str]]:
    """(grid, answer) pairs of one conversation, each answer with the last grid before it: blocks of lines made of
    ``symbols``, square ones or (``square=False``) any with rows as wide as each other."""
    cell = "[" + re.escape(symbols) + "]"
    tokens = re.compile(rf"(?P<grid>{cell}+(?:\n{cell}+)+)|<answer>(?P<answer>.*?)</answer>", re.S)
    pairs, grid = [], None
    for match in tokens.finditer(text):
        if match.group("grid"):
            lines = match.group("grid").split("\n")
            if (is_square if square else is_rectangle)(lines):
                grid = lines
        elif grid is not None:
            pairs.append((grid, match.group("answer").strip()))
            grid = None  # one answer per observation
    return pairs


def moves(text: str) -> list[tuple[list[str], str]]:
    """(grid, answer) pairs of one FrozenLake conversation."""
    return grid_answers(text, "".join(GRID_LOOKUP.values()))


def move_kind(text: str) -> str:
    """The last move of a row's text: "optimal", "other", or "unparsed" (no answer, not one of the four moves, or no
    board)."""
    pairs = moves(text)
    graded = grade(pairs[-1][0]) if pairs else None
    if graded is None or pairs[-1][1] not in graded:
        return "unparsed"
    return "optimal" if graded[pairs[-1][1]][0] else "other"


def hole_picks(answered: Iterable[tuple[dict[str, tuple[bool, bool]], str]]) -> dict[str, float]:
    """Per move M, ``hole_M``: among the boards (graded tables) where M falls into a hole, the share answered M (a
    uniform mover: 0.25; a policy that sees the hole: 0)."""
    holes: Counter[str] = Counter()
    picked: Counter[str] = Counter()
    for table, answer in answered:
        for move, (_, hole) in table.items():
            if hole:
                holes[move] += 1
                picked[move] += answer == move
    return {f"hole_{move}": picked[move] / max(holes[move], 1) for move in MOVES}


def tally(answered: list[tuple[dict[str, tuple[bool, bool]], str]]) -> dict[str, float]:
    """The shares of (graded table, answer) pairs: optimal, into a hole, unparsable (not one of the four moves), a
    uniform mover's optimal and into-a-hole shares on the same boards, and :func:`hole_picks`."""
    n = max(len(answered), 1)
    chosen = [table.get(answer) for table, answer in answered]
    return {
        "moves": float(len(answered)),
        "optimal": sum(c[0] for c in chosen if c) / n,
        "into_hole": sum(c[1] for c in chosen if c) / n,
        "unparsable": sum(c is None for c in chosen) / n,
        "random_optimal": sum(sum(o for o, _ in table.values()) / 4 for table, _ in answered) / n,
        "random_into_hole": sum(sum(h for _, h in table.values()) / 4 for table, _ in answered) / n,
        **hole_picks(answered),
    }


def report(path: Path) -> dict[str, float]:
    answered = []
    for line in path.open():
        row = json.loads(line)
        for grid, answer in moves(row["prompt"] + row["response"]):
            table = grade(grid)
            if table is not None:
                answered.append((table, answer))
    out = tally(answered)
    out["demonstrator_optimal"] = (1 - DEMONSTRATOR_NOISE) + DEMONSTRATOR_NOISE * out["random_optimal"]
    out["demonstrator_into_hole"] = DEMONSTRATOR_NOISE * out["random_into_hole"]
    return out


def format_stats(stats: dict[str, float]) -> str:
    """One indented line of ``key=value`` (three decimals; ``moves`` a count)."""
    return "  " + "  ".join(f"{k}={v:.3f}" if k != "moves" else f"moves={int(v)}" for k, v in stats.items())


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    for name in argv:
        print(name)
        print(format_stats(report(Path(name))))


if __name__ == "__main__":
    main(sys.argv[1:])
