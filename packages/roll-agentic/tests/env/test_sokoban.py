"""Sokoban: generated rooms are solvable, rewards follow gym-sokoban, rendering follows the grid vocab."""

from __future__ import annotations

import pytest

from roll.agentic.env import SokobanEnv
from roll.agentic.env.sokoban_gen import WALL, Room, solve
from roll.runtime import ConfigError


def _answer(action: str) -> str:
    return f"<answer>{action}</answer>"


@pytest.mark.parametrize(("dim_room", "num_boxes", "search_depth"), [((6, 6), 1, 30), ((7, 7), 2, 10)])
def test_rooms_are_solvable_and_solution_succeeds(dim_room, num_boxes, search_depth) -> None:
    env = SokobanEnv(dim_room=dim_room, num_boxes=num_boxes, search_depth=search_depth, max_steps=200)
    for seed in range(15):
        observation, info = env.reset(seed=seed)
        room = env.room
        assert len(room.boxes) == num_boxes and not room.boxes <= room.targets  # at least one box to push
        assert observation.count("\n") == dim_room[0] - 1 and all(
            len(row) == dim_room[1] for row in observation.split("\n")
        )
        assert all(v == WALL for v in room.fixed[0]) and all(row[0] == WALL for row in room.fixed)
        plan = env.solution()
        assert plan is not None and 0 < len(plan) <= search_depth
        total = 0.0
        for action in plan:
            observation, reward, terminated, truncated, info = env.step(_answer(action))
            total += reward
        assert terminated and not truncated and info["success"]
        # -0.1 per move, +1 per box landing on a target, +10 at the end (pushes off targets cancel their +1).
        assert total >= 10.0 + 1.0 * 1 - 0.1 * len(plan) - 1e-9


def test_seeded_rooms_are_reproducible() -> None:
    a, b = SokobanEnv(), SokobanEnv()
    assert a.reset(seed=11)[0] == b.reset(seed=11)[0]
    assert a.reset(seed=11)[0] != a.reset(seed=12)[0]


def test_push_rewards_and_blocked_moves() -> None:
    # A corridor: player, box, target in a row. Pushing right puts the box on the target.
    fixed = ((0, 0, 0, 0, 0, 0), (0, 1, 1, 1, 2, 0), (0, 0, 0, 0, 0, 0))
    env = SokobanEnv(max_steps=10)  # the room below is set by hand (3x6: too small to generate)
    env.room = Room(fixed, frozenset({(1, 3)}), (1, 2))
    env.boxes, env.player, env.steps = env.room.boxes, env.room.player, 0
    assert env.render() == "######\n#_PXO#\n######"
    observation, reward, _, _, info = env.step(_answer("Up"))  # into a wall: nothing moves
    assert reward == pytest.approx(-0.1) and not info["action_is_effective"] and observation == env.render()
    observation, reward, terminated, _truncated, info = env.step(_answer("Right"))
    assert observation == "######\n#__P√#\n######"
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0) and terminated and info["success"]


def test_invalid_action_costs_step_and_format_penalty() -> None:
    env = SokobanEnv(format_penalty=-0.15)
    before, _ = env.reset(seed=0)
    observation, reward, _terminated, _truncated, info = env.step("push it")
    assert observation == before and reward == pytest.approx(-0.25) and not info["action_is_valid"]


def test_grid_vocab_override() -> None:
    lookup = {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    env = SokobanEnv(grid_lookup=lookup, grid_vocab={"W": "wall"})
    observation, info = env.reset(seed=3)
    assert set(observation.replace("\n", "")) <= set("W.GCBA@") and "W: wall" in info["env_instruction"]


def test_solver_reports_unsolvable() -> None:
    fixed = ((0, 0, 0, 0), (0, 1, 2, 0), (0, 0, 0, 0))
    # The box sits in a corner next to no target it can reach: the player cannot get behind it.
    room = Room(((0, 0, 0, 0, 0), (0, 1, 1, 2, 0), (0, 0, 0, 0, 0)), frozenset({(1, 1)}), (1, 2))
    assert solve(room) is None
    assert solve(Room(fixed, frozenset({(1, 2)}), (1, 1))) == []


def test_grid_vocab_empty_means_no_legend() -> None:
    assert "The meaning of each symbol" not in SokobanEnv(grid_vocab={}).instructions()
    assert "The meaning of each symbol" in SokobanEnv().instructions()


def test_search_depth_sets_how_many_moves_a_room_needs() -> None:
    # Of the positions with the box pulled equally far, the generator keeps the one the most backward moves away,
    # and re-carves corridors where one push is all there is: keeping the nearest left the player where its last
    # pull ended, and over half the rooms one push from solved at any depth.
    def shortest(search_depth: int) -> list[int]:
        env = SokobanEnv(dim_room=(5, 5), num_boxes=1, search_depth=search_depth, max_steps=50)
        plans = []
        for seed in range(40):
            env.reset(seed=seed)
            plan = env.solution()
            assert plan is not None and 0 < len(plan) <= search_depth
            plans.append(len(plan))
        return sorted(plans)

    assert shortest(1) == [1] * 40
    deeper, deepest = shortest(6), shortest(30)
    assert deeper[20] >= 3 and sum(n == 1 for n in deeper) <= 10, deeper
    assert sum(deepest) > sum(deeper), (deeper, deepest)


@pytest.mark.parametrize("dim_room", [(3, 6), (4, 4)])
def test_rooms_too_small_to_pull_a_box_are_refused_up_front(dim_room) -> None:
    # 4x4 once passed this check and then failed 200 carvings: inside its walls no box can be pulled.
    with pytest.raises(ConfigError, match=r"too small.*use at least \[4, 5\]"):
        SokobanEnv(dim_room=dim_room).reset(seed=0)
    assert SokobanEnv(dim_room=(4, 5), search_depth=6).reset(seed=0)[0].count("\n") == 3


def test_random_actions_follow_the_seed() -> None:
    draws = [SokobanEnv().sample_random_action(seed=s) for s in range(40)]
    assert draws == [SokobanEnv().sample_random_action(seed=s) for s in range(40)]
    assert set(draws) == {_answer(a) for a in SokobanEnv.ACTIONS}


def test_a_rooms_split_does_not_depend_on_the_grid_symbols() -> None:
    # a train tag and a val tag whose grid_lookup differ must still never share a layout
    lookup = {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    settings = {"dim_room": (5, 5), "search_depth": 4}
    for split in ("train", "val"):
        default, custom = SokobanEnv(split=split, **settings), SokobanEnv(split=split, grid_lookup=lookup, **settings)
        for seed in range(40):
            default.reset(seed)
            custom.reset(seed)
            assert default.room == custom.room, (split, seed)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dim_room": (4, 4)}, r"dim_room=\[4, 4\] is too small"),
        ({"num_boxes": 0}, "num_boxes >= 1"),
        ({"search_depth": 0}, "search_depth >= 1"),
        ({"dim_room": 6}, r"dim_room=6 must be \[rows, cols\], two integers"),
        ({"dim_room": [6, "six"]}, r"dim_room=\[6, 'six'\] must be \[rows, cols\]"),
    ],
)
def test_settings_no_room_can_have_fail_when_the_env_is_built(settings, message) -> None:
    # not at its first reset, where they would end every episode as an env fault (or a TypeError)
    with pytest.raises(ConfigError, match=message):
        SokobanEnv(**settings)
