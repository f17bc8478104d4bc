"""Scripted experts (warm-up demonstrators) solve their envs; train/val splits never share a layout."""

from __future__ import annotations

import random

import pytest

from roll.agentic.env.frozen_lake import FrozenLakeEnv, read_board
from roll.agentic.env.math_tool import ArithmeticEnv
from roll.agentic.env.sokoban import SokobanEnv, read_room
from roll.agentic.policy.expert import FrozenLakeExpert, SokobanExpert, ToolMathExpert, is_square, last_grid


def _play(env, policy, seed: int, turns: int) -> bool:
    observation, _ = env.reset(seed)
    info = {"success": False}
    for _ in range(turns):
        observation, _, terminated, truncated, info = env.step(policy(f"Turn:\n{observation}", random.Random(seed)))
        if terminated or truncated:
            break
    return bool(info["success"])


def test_last_grid_takes_the_latest_square_block():
    text = "Turn 1:\nP_\n_G\nsomething\nTurn 2:\n[_P\n_G] Decide"
    assert last_grid(text, "P_OGX√") == ["_P", "_G"]
    assert last_grid("no grid here", "P_OGX√") is None


def test_is_square_accepts_only_square_blocks():
    assert is_square(["P_", "_G"])
    assert not is_square(["P_O", "_G_"])  # wider than tall
    assert not is_square(["P_", "_"])  # ragged
    assert not is_square([])


def test_frozen_lake_board_reader_and_expert():
    assert read_board(["P_O", "_O_", "__G"]) == (["SFH", "FHF", "FFG"], (0, 0), (2, 2))
    assert read_board(["__O", "_X_", "__G"]) is None  # the player fell into a hole
    assert read_board(["a.h", ".h.", "..g"], {0: "a", 1: ".", 2: "h", 3: "g"}) == (
        ["SFH", "FHF", "FFG"],
        (0, 0),
        (2, 2),
    )
    assert FrozenLakeExpert().action(["P_O", "_O_", "__G"]) == "Down"  # the only hole-free shortest path: down
    assert FrozenLakeExpert(grid_lookup={0: "a", 1: ".", 2: "h", 3: "g"}).action(["a.h", ".h.", "..g"]) == "Down"


def test_frozen_lake_expert_solves_and_noise_hurts():
    def rate(noise: float) -> float:
        wins = [_play(FrozenLakeEnv(size=4, max_steps=12), FrozenLakeExpert(noise), s, 12) for s in range(60)]
        return sum(wins) / len(wins)

    assert rate(0.0) == 1.0
    assert rate(1.0) < 0.6


@pytest.mark.parametrize("dim_room", [(5, 5), (6, 8), (7, 6)])
def test_sokoban_expert_solves_rooms_square_or_not(dim_room):
    # It read only square grids once, and moved at random in rooms of other shapes (0.3 solved at 6 x 8).
    env = SokobanEnv(dim_room=dim_room, num_boxes=1, search_depth=10)
    wins = [_play(env, SokobanExpert(), s, 30) for s in range(10)]
    assert all(wins)


def test_read_room_parses_the_rendered_grid():
    room = read_room(["#####", "#_PX#", "#__O#", "#####"])
    assert room is not None and room.player == (1, 2) and room.boxes == {(1, 3)} and room.targets == {(2, 3)}
    assert read_room(["###", "#X#", "###"]) is None  # no player
    assert SokobanExpert().action(["#####", "#_PX#", "#__O#", "#####"]) is None  # box in a corner off its target
    assert SokobanExpert().action(["####", "#P_#", "#X_#", "#O_#", "####"]) == "Down"


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda split: FrozenLakeEnv(size=3, split=split), lambda env, obs: "\n".join(env.board)),
        (lambda split: SokobanEnv(dim_room=(5, 5), search_depth=4, split=split), lambda env, obs: obs),
        (lambda split: ArithmeticEnv(digits=1, split=split), lambda env, obs: obs),
    ],
)
def test_train_and_val_splits_share_no_layout(make, key):
    seen = {}
    for split in ("train", "val"):
        env = make(split)
        seen[split] = {key(env, env.reset(seed)[0]) for seed in range(150)}
    assert seen["train"] and seen["val"]
    assert not seen["train"] & seen["val"]


@pytest.mark.parametrize(
    "tool_turn",
    [
        "<|im_start|>tool\npython_code result:\n476216<|im_end|>\n",  # ChatML's tool role
        "<|im_start|>user\n<tool_response>\npython_code result:\n476216\n</tool_response><|im_end|>\n",  # Qwen's
    ],
)
def test_tool_math_expert_reads_the_tool_answer_however_the_template_wraps_it(tool_turn):
    """The expert calls the tool, then answers with what the tool printed: it used to look for ChatML's tool role
    only, so under Qwen's templates it called the tool again every turn and never answered."""
    expert, rng = ToolMathExpert(), random.Random(0)
    question = "<|im_start|>user\nWhat is 892 * 533?<|im_end|>\n<|im_start|>assistant\n"
    call = expert(question, rng)
    assert call.startswith("<tool_call>") and "print(892 * 533)" in call
    assert (
        expert(question + call + "<|im_end|>\n" + tool_turn + "<|im_start|>assistant\n", rng)
        == "<answer>476216</answer>"
    )
