"""tools/diagnostics/frozenlake_moves grades moves against the board: the noise-free planner is optimal on every
move, a random mover matches the chance rate computed on the same boards, and a hand-checked board grades as expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.agentic.env.frozen_lake import FrozenLakeEnv
from roll.agentic.policy.expert import FrozenLakeExpert
from tools.diagnostics.frozenlake_moves import grade, hole_picks, moves, report


def test_grade_of_a_hand_checked_board():
    grid = ["P_O_", "_O__", "___G", "____"]  # player top-left, holes at (0,2) and (1,1), goal at (2,3)
    table = grade(grid)
    assert table is not None
    assert {m for m, (optimal, _) in table.items() if optimal} == {"Down"}  # Right leads to a dead end
    assert {m for m, (_, hole) in table.items() if hole} == set()
    table = grade(["_P__", "_O__", "___G", "____"])
    assert table["Down"] == (False, True) and table["Right"] == (True, False)
    assert grade(["____", "_X__", "___G", "____"]) is None  # the player is in a hole


def test_hole_picks_counts_answers_on_the_boards_where_that_move_falls_into_a_hole():
    below = grade(["_P__", "_O__", "___G", "____"])  # Down falls into the hole
    beside = grade(["OP__", "____", "___G", "____"])  # Left does
    assert below is not None and beside is not None
    picks = hole_picks([(below, "Down"), (below, "Right"), (below, "garbage"), (beside, "Down"), (beside, "Right")])
    assert picks == {"hole_Left": 0.0, "hole_Down": pytest.approx(1 / 3), "hole_Right": 0.0, "hole_Up": 0.0}


@pytest.fixture
def dump(tmp_path: Path, scripted_rollouts):
    """``dump(noise, episodes=40)``: the planner with ``noise`` playing that many 4x4 boards, as a rollout dump."""

    def play(noise: float, episodes: int = 40) -> Path:
        return scripted_rollouts(
            tmp_path / f"noise-{noise}.jsonl",
            lambda: FrozenLakeEnv(size=4, max_steps=6),
            FrozenLakeExpert(noise),
            episodes,
            6,
        )

    return play


def test_planner_is_optimal_and_a_random_mover_is_at_chance(dump):
    planner = report(dump(0.0))
    assert planner["moves"] > 40 and planner["optimal"] == 1.0 and planner["into_hole"] == 0.0
    assert planner["unparsable"] == 0.0
    assert all(planner[f"hole_{move}"] == 0.0 for move in ("Left", "Down", "Right", "Up"))
    rows = [json.loads(line) for line in dump(0.0).open()]
    assert len(moves(rows[0]["prompt"] + rows[0]["response"])) >= 1
    chance = report(dump(1.0, episodes=200))
    assert chance["optimal"] == pytest.approx(chance["random_optimal"], abs=0.08)
    assert chance["into_hole"] == pytest.approx(chance["random_into_hole"], abs=0.06)
    assert all(chance[f"hole_{move}"] == pytest.approx(0.25, abs=0.12) for move in ("Left", "Down", "Right", "Up"))
    assert chance["demonstrator_optimal"] == pytest.approx(0.5 + 0.5 * chance["random_optimal"])
