"""tools/diagnostics/sokoban_moves grades moves against the room: a hand-checked room grades as expected, the noise-free
planner is optimal on every move (in rooms of any shape), a random mover matches the chance rate computed on the same
rooms, and the held-out rooms' baselines put the random mover far below the planner."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.agentic.env.sokoban import SokobanEnv
from roll.agentic.policy.expert import SokobanExpert
from tools.diagnostics.sokoban_moves import grade, report, room_baselines


def test_grade_of_a_hand_checked_room():
    # Box below the player, target below the box: pushing Down solves it; the other moves lengthen the way.
    assert grade(["####", "#P_#", "#X_#", "#O_#", "####"]) == {"Up": False, "Down": True, "Left": False, "Right": False}
    assert grade(["#####", "#_PX#", "#__O#", "#####"]) is None  # the box is stuck in a corner off its target
    assert grade(["####", "#X_#", "#O_#", "####"]) is None  # no player


@pytest.fixture
def dump(tmp_path: Path, scripted_rollouts):
    """``dump(noise, dim_room, episodes)``: the planner with ``noise`` playing that many rooms, as a rollout dump."""

    def play(noise: float, dim_room: tuple[int, int], episodes: int) -> Path:
        return scripted_rollouts(
            tmp_path / f"noise-{noise}-{dim_room[0]}x{dim_room[1]}.jsonl",
            lambda: SokobanEnv(dim_room=dim_room, num_boxes=1, search_depth=6, max_steps=8),
            SokobanExpert(noise=noise),
            episodes,
            8,
        )

    return play


@pytest.mark.parametrize("dim_room", [(5, 5), (6, 7)])
def test_planner_is_optimal_and_a_random_mover_is_at_chance(dump, dim_room):
    planner = report(dump(0.0, dim_room, 30))
    assert planner["moves"] >= 60 and planner["optimal"] == 1.0 and planner["unparsable"] == 0.0
    chance = report(dump(1.0, dim_room, 60))
    assert chance["optimal"] == pytest.approx(chance["random_optimal"], abs=0.08)
    assert 0.1 < chance["random_optimal"] < 0.5


def test_held_out_rooms_leave_a_random_mover_far_below_the_planner():
    stats = room_baselines(rooms=60)
    assert stats["planner"] == 1.0 and stats["random_mover"] < 0.3
    assert stats["median_solution"] >= 3 and stats["one_move_rooms"] < 0.2
