"""ROLL's ``sokoban_tool_call``: moves are ``move_player`` tool calls, each answered by a ``tool`` message; invalid
calls cost what an invalid ``sokoban_native_env`` action costs; ``full_history`` takes an invalid round out."""

from __future__ import annotations

import json

import pytest

from roll.agentic.env import check_env, make_env
from roll.agentic.env.sokoban_tool_call import BAD_CALL, MOVE_PLAYER, NO_CALL
from roll.runtime import ConfigError

CONFIG = {"max_steps": 20, "format_penalty": -0.15, "search_depth": 30}
INVALID = -0.1 - 0.15  # sokoban's step penalty plus format_penalty


def call(direction: str, name: str = "move_player") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"direction": "{direction}"}}}}</tool_call>'


def test_reset_offers_the_move_player_tool() -> None:
    env = make_env("sokoban_tool_call", **CONFIG)
    messages, info = env.reset(seed=3)
    assert info == {"tools": [MOVE_PLAYER], "success": False}
    schema = info["tools"][0]["function"]
    assert schema["name"] == "move_player" and schema["parameters"]["required"] == ["direction"]
    assert schema["parameters"]["properties"]["direction"]["enum"] == ["up", "down", "left", "right"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "move_player" in messages[0]["content"] and "<answer>" not in messages[0]["content"]
    assert messages[1]["content"] == f"Here is the current state:\n{env.game.render()}"


def test_calls_play_the_solution_with_sokoban_native_rewards() -> None:
    env, native = make_env("sokoban_tool_call", **CONFIG), make_env("sokoban_native_env", **CONFIG)
    env.reset(seed=5)
    native.reset(seed=5)
    plan = env.game.solution()
    assert plan
    for i, move in enumerate(plan):
        before = env.game.render()
        messages, reward, terminated, truncated, info = env.step(call(move.lower()))
        _, native_reward, native_terminated, *_ = native.step(f"<answer>{move}</answer>")
        assert (reward, terminated) == (native_reward, native_terminated)
        assert env.game.render() == native.game.render() != before
        assert info["action_is_valid"] and info["metrics"]["action_is_effective"] == 1.0
        assistant, tool = messages[-2:]
        assert assistant["tool_calls"] == [
            {
                "type": "function",
                "id": "move_player_0",
                "function": {"name": "move_player", "arguments": json.dumps({"direction": move.lower()})},
            }
        ]
        assert tool["role"] == "tool" and tool["tool_call_id"] == "move_player_0"
        assert tool["content"].startswith(f"Moved {move.lower()}.") and tool["content"].endswith(env.game.render())
        assert len(messages) == 2 + 2 * (i + 1)  # no user message repeats the room after a valid call
    assert terminated and not truncated and info["success"] and info["metrics"]["success"] == 1.0
    assert "solved" in messages[-1]["content"] and reward > 10


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>{"name": "move_player", "arguments": "{\\"direction\\": \\"up\\"}"}</tool_call>',  # a JSON string
        "<tool_call><function=move_player><parameter=direction>up</parameter></function></tool_call>",  # Qwen3-Coder
    ],
)
def test_other_ways_of_writing_the_call_are_read(reply: str) -> None:
    env = make_env("sokoban_tool_call", **CONFIG)
    env.reset(seed=3)
    messages, reward, _, _, info = env.step(reply)
    assert info["action_is_valid"] and reward == pytest.approx(-0.1) and messages[-1]["content"].startswith("Moved up.")


def test_a_blocked_move_is_valid_and_says_so() -> None:
    env = make_env("sokoban_tool_call", **CONFIG)
    env.reset(seed=3)  # the player starts in the bottom-left corner, a wall to its left
    room = env.game.render()
    messages, reward, _, _, info = env.step(call("LEFT"))
    assert reward == pytest.approx(-0.1) and info["action_is_valid"] and not info["action_is_effective"]
    assert messages[-1]["content"] == f"Moved left: blocked, the player did not move.\n\nCurrent state:\n{room}"


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (call("north"), "direction 'north' is not one of up, down, left, right."),
        (call("up", name="jump"), "unknown tool 'jump'; the only tool is move_player."),
        ('<tool_call>{"name": "move_player", "arguments": {"dir": "up"}}</tool_call>', 'takes {"direction": ...}'),
        ('<tool_call>{"name": "move_player", "arguments": "up"}</tool_call>', 'takes {"direction": ...}'),
        ('<tool_call>{"name": "move_player"}</tool_call>', 'takes {"direction": ...}'),
        ('<tool_call>{"name": "move_player", "arguments": {"direction": 3}}</tool_call>', "direction 3 is not one"),
    ],
)
def test_an_invalid_call_costs_the_penalty_and_is_answered(reply: str, problem: str) -> None:
    env = make_env("sokoban_tool_call", **CONFIG)
    env.reset(seed=3)
    room = env.game.render()
    messages, reward, terminated, truncated, info = env.step(reply)
    assert reward == pytest.approx(INVALID) and not (terminated or truncated)
    assert not info["action_is_valid"] and info["metrics"]["action_is_valid"] == 0.0
    assert env.game.render() == room and env.game.steps == 1  # nothing moved; the turn counts toward max_steps
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[3]["tool_call_id"] == messages[2]["tool_calls"][0]["id"]
    assert messages[3]["content"].startswith("Error: ") and problem in messages[3]["content"]
    assert messages[3]["content"].endswith(f"Current state:\n{room}")


@pytest.mark.parametrize(
    ("reply", "problem"), [("I would go up.", NO_CALL), ('<tool_call>{"name": move_player</tool_call>', BAD_CALL)]
)
@pytest.mark.parametrize("full_history", [False, True])
def test_a_reply_without_a_readable_call_gets_a_reminder(reply: str, problem: str, full_history: bool) -> None:
    env = make_env("sokoban_tool_call", full_history=full_history, **CONFIG)
    env.reset(seed=3)
    messages, reward, _, _, info = env.step(reply)
    assert reward == pytest.approx(INVALID) and not info["action_is_valid"] and env.game.steps == 1
    assert messages[2:] == [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"{problem}\n\nCurrent state:\n{env.game.render()}"},
    ]


def test_full_history_takes_an_invalid_round_out() -> None:
    kept, forked = (make_env("sokoban_tool_call", full_history=flag, **CONFIG) for flag in (False, True))
    for env in (kept, forked):
        env.reset(seed=3)
        env.step(call("up"))
    kept_messages, kept_reward, *_ = kept.step(call("sideways"))
    forked_messages, forked_reward, *_ = forked.step(call("sideways"))
    assert kept_reward == forked_reward == pytest.approx(INVALID)
    assert kept_messages[:4] == forked_messages[:4]  # the valid round before stays
    assert [m["role"] for m in kept_messages[4:]] == ["assistant", "tool"]
    assert [m["role"] for m in forked_messages[4:]] == ["user"]  # the assistant + tool round is gone
    warning = forked_messages[4]["content"]
    assert warning.startswith("Your last move_player call was invalid: direction 'sideways' is not one of")
    assert "removed" in warning and warning.endswith(f"Current state:\n{forked.game.render()}")
    # a valid call after it is answered as usual
    forked_messages, _, _, _, info = forked.step(call("up"))
    assert info["action_is_valid"] and [m["role"] for m in forked_messages[4:]] == ["user", "assistant", "tool"]


def test_only_the_first_of_several_calls_is_played_and_each_is_answered() -> None:
    env = make_env("sokoban_tool_call", **CONFIG)
    env.reset(seed=3)
    messages, reward, *_ = env.step(f"Going up twice.\n{call('up')}\n{call('up')}")
    assert env.game.steps == 1 and reward == pytest.approx(-0.1)
    assistant, first, second = messages[2:]
    assert assistant["content"] == "Going up twice.\n" and [c["id"] for c in assistant["tool_calls"]] == [
        "move_player_0",
        "move_player_1",
    ]
    assert first["tool_call_id"] == "move_player_0" and first["content"].startswith("Moved up.")
    assert second == {"role": "tool", "tool_call_id": "move_player_1", "content": second["content"]}
    assert second["content"].startswith("Error: not played. One move per reply")


def test_max_steps_truncates_and_seeds_repeat() -> None:
    replies = [call("up"), "nothing", call("east"), call("right")]

    def play(seed: int) -> list:
        env = make_env("sokoban_tool_call", **{**CONFIG, "max_steps": 4})
        out = [env.reset(seed=seed)]
        out += [env.step(reply) for reply in replies]
        return out

    first = play(11)
    assert first == play(11) and first[0] != play(12)[0]
    assert [step[3] for step in first[1:]] == [False, False, False, True]  # the 4th turn reaches max_steps


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="full_history='yes' must be true or false"):
        make_env("sokoban_tool_call", full_history="yes")
    with pytest.raises(ConfigError, match="action_pattern=.*remove action_pattern"):
        make_env("sokoban_tool_call", action_pattern="<move>(.*)</move>")
    # a misspelt key is named when the config is checked (roll validate), with every key the env takes
    with pytest.raises(ConfigError, match=r"sokoban_tool_call.*'full_histroy'.*accepted keys: \['full_history'") as e:
        check_env("sokoban_tool_call", {"full_histroy": True})
    for key in ("system_template", "observation_suffix", "dim_room", "format_penalty", "grid_vocab", "max_steps"):
        assert repr(key) in str(e.value)
    assert check_env("sokoban_tool_call", {"full_history": True, "dim_room": [5, 5], "system_template": "Hi"})


def test_observation_suffix_and_env_instruction_are_used() -> None:
    env = make_env("sokoban_tool_call", observation_suffix="Your move:", env_instruction="Push boxes.", **CONFIG)
    messages, _ = env.reset(seed=3)
    assert "Push boxes." in messages[0]["content"] and messages[1]["content"].endswith("\n\nYour move:")
    messages, *_ = env.step(call("up"))
    assert messages[-1]["content"].endswith("\n\nYour move:")


def test_sokoban_native_env_names_a_misspelt_key_too() -> None:
    """The parent env passes its ``**sokoban`` on to SokobanEnv; its signature says which keys that takes."""
    with pytest.raises(ConfigError, match=r"sokoban_native_env.*'dim_rooms'.*accepted keys"):
        check_env("sokoban_native_env", {"dim_rooms": [5, 5]})
    assert check_env("sokoban_native_env", {"dim_room": [5, 5], "grid_vocab": None, "observation_suffix": ""})
    with pytest.raises(ConfigError, match=r"'full_history'"):  # the subclass's key is not the parent's
        check_env("sokoban_native_env", {"full_history": True})
