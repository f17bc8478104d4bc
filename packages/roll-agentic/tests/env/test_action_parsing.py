"""ROLL's action patterns: answer, think+answer, choices, special tokens."""

from __future__ import annotations

import pytest

from roll.agentic.env import ACTION_PATTERN, THINK_ACTION_PATTERN, FrozenLakeEnv, SokobanEnv, parse_action
from roll.runtime import ConfigError


def test_answer_pattern_with_choices_is_case_insensitive() -> None:
    parsed = parse_action("I go <answer> right </answer><|im_end|>", ACTION_PATTERN, ["Left", "Right"])
    assert (parsed.action, parsed.content, parsed.valid) == ("Right", "right", True)


def test_choice_outside_the_list_is_invalid() -> None:
    parsed = parse_action("<answer>Jump</answer>", ACTION_PATTERN, ["Left", "Right"])
    assert parsed.action is None and parsed.content == "Jump" and not parsed.valid


def test_missing_answer_is_invalid() -> None:
    assert parse_action("Right", ACTION_PATTERN, ["Right"]) == parse_action("", ACTION_PATTERN, ["Right"])
    assert not parse_action("<answer>Right", ACTION_PATTERN, ["Right"]).valid


def test_think_then_answer() -> None:
    parsed = parse_action("<think>the goal is east</think>\n<answer>Right</answer>", THINK_ACTION_PATTERN, ["Right"])
    assert (parsed.think, parsed.action) == ("the goal is east", "Right")
    # Without the think block the think+answer pattern does not match.
    assert not parse_action("<answer>Right</answer>", THINK_ACTION_PATTERN, ["Right"]).valid


def test_free_text_answer_without_choices() -> None:
    assert parse_action("<answer>42</answer>").action == "42"
    assert parse_action("<answer>  </answer>").action is None


def test_bad_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="groups"):
        parse_action("x", r"<answer>.*</answer>")
    with pytest.raises(ConfigError, match="regular expression"):
        parse_action("x", r"<answer>(.*</answer>")


@pytest.mark.parametrize("env_cls", [FrozenLakeEnv, SokobanEnv])
@pytest.mark.parametrize("pattern", ["<answer>(.*</answer>", "<answer>.*</answer>"])
def test_a_bad_action_pattern_fails_when_the_env_is_built(env_cls, pattern) -> None:
    # not at its first step, where it would end every episode as an env fault
    with pytest.raises(ConfigError, match="action_pattern"):
        env_cls(action_pattern=pattern)
