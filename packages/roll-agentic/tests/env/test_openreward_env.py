"""ROLL's ``openreward_env``, played through the real ``openreward`` SDK against a local fake of OpenReward's server."""

from __future__ import annotations

import json
import sys

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env import check_env, make_env
from roll.agentic.env.openreward_env import BAD_CALL, NO_CALL, OpenRewardEnv, check_env_config
from roll.agentic.env.openreward_testing import FAKE_API_KEY
from roll.runtime import ConfigError, MissingExtraError

needs_sdk = pytest.mark.extra("openreward")  # the server fixture skips without the SDK

BASH_LS = "<tool_call>\n<function=bash>\n<parameter=command>ls -la</parameter>\n</function>\n</tool_call>"
SUBMIT_42 = '<tool_call>{"name": "submit", "arguments": {"answer": "42"}}</tool_call>'


def score(*values: float) -> str:
    return "".join(f'<tool_call>{{"name": "score", "arguments": {{"value": {v}}}}}</tool_call>' for v in values)


@pytest.fixture
def server(openreward_server):
    return openreward_server


@pytest.fixture
def make(server):
    """``make(**env_config)``: an env on the fake server (closed after the test)."""
    envs: list[OpenRewardEnv] = []

    def build(**env_config) -> OpenRewardEnv:
        env = make_env("openreward_env", **{"environment_name": "test/Echo", "retry_backoff_seconds": 0, **env_config})
        assert isinstance(env, OpenRewardEnv)
        envs.append(env)
        return env

    yield build
    for env in envs:
        env.close()


@needs_sdk
def test_reset_picks_the_task_by_seed(make, server) -> None:
    env, other = make(), make()
    obs, info = env.reset(seed=7)
    assert obs == [{"role": "user", "content": "Task 2: find the answer and submit it."}]
    assert info["task_name"] == "test/Echo:train:2" and info["success"] is False
    assert other.reset(seed=7) == (obs, info)  # equal seeds, equal episodes
    assert env.reset(seed=3)[0][0]["content"].startswith("Task 3:")
    assert env.reset(seed=None)[0][0]["content"].startswith("Task 0:")
    assert len(server.open_sessions) == 2  # each reset closed the env's previous session
    assert OpenRewardEnv.seed_is_index


@needs_sdk
def test_tools_are_offered_and_listed_in_the_system_prompt(make) -> None:
    _, info = make().reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["bash", "score", "submit", "crash"]
    assert info["tools"][0] == {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    obs, info = make(system_prompt_template="Solve it with:\n{tools}\nGood luck.").reset(seed=1)
    system, user = obs
    assert system["role"] == "system" and user["content"].startswith("Task 1:")
    lines = system["content"].split("\n")
    assert lines[0] == "Solve it with:" and lines[-1] == "Good luck."
    assert [json.loads(line) for line in lines[1:-1]] == info["tools"]


@needs_sdk
def test_a_tool_call_is_forwarded_and_its_result_returned(make, server) -> None:
    env = make()
    env.reset(seed=4)
    obs, reward, terminated, truncated, info = env.step(BASH_LS)
    assert server.calls == [(4, "bash", {"command": "ls -la"})]
    assert obs[-2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls -la"}'}
    assert obs[-1] == {"role": "tool", "tool_call_id": "bash_0", "name": "bash", "content": "ran: ls -la"}
    assert (reward, terminated, truncated, info["action_is_valid"]) == (0.0, False, False, True)
    # A tool the environment does not have: its refusal is the tool's answer and the episode goes on.
    obs, _, terminated, _, info = env.step('<tool_call>{"name": "rm", "arguments": {}}</tool_call>')
    assert obs[-1]["role"] == "tool" and "'rm' is not a valid tool" in obs[-1]["content"] and not terminated
    assert info["metrics"]["num_failed_tool_calls"] == 1.0 and info["metrics"]["num_tool_calls"] == 2.0
    # No call: a reminder; a call that does not parse: how to write one (an invalid action).
    obs, _, terminated, _, info = env.step("I am thinking.")
    assert obs[-1] == {"role": "user", "content": NO_CALL} and info["action_is_valid"] and not terminated
    obs, _, _, _, info = env.step('<tool_call>{"name": "bash", "arguments": </tool_call>')
    assert obs[-1] == {"role": "user", "content": BAD_CALL} and info["action_is_valid"] is False
    assert len(server.calls) == 2  # neither reached the server


@pytest.mark.parametrize(("reduction", "expected"), [("sum", 1.75), ("mean", 1.75 / 3), ("max", 1.0), ("min", 0.25)])
@needs_sdk
def test_rewards_are_reduced_on_the_last_turn(make, server, reduction, expected) -> None:
    env = make(reward_reduction=reduction)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(score(0.5, 0.25))  # two calls in one reply: both run
    assert [c[1:] for c in server.calls] == [("score", {"value": 0.5}), ("score", {"value": 0.25})]
    assert (reward, terminated) == (0.0, False) and [m["role"] for m in obs[-3:]] == ["assistant", "tool", "tool"]
    _, reward, terminated, truncated, info = env.step(SUBMIT_42)
    assert reward == pytest.approx(expected) and terminated and not truncated
    assert info["success"] and info["metrics"]["raw_reward"] == pytest.approx(expected)
    assert server.open_sessions == []  # closed when the episode ended


@pytest.mark.parametrize(("nonterminal", "expected"), [(-1.0, -0.5), (None, 0.5)])
@needs_sdk
def test_truncation_adds_the_nonterminal_reward(make, server, nonterminal, expected) -> None:
    env = make(max_steps=2, nonterminal_reward=nonterminal)
    env.reset(seed=0)
    assert env.step(score(0.5))[1:4] == (0.0, False, False)
    _, reward, terminated, truncated, info = env.step(BASH_LS)
    assert (reward, terminated, truncated) == (pytest.approx(expected), True, True)
    assert info["failure_mode"] == "" and server.open_sessions == []
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(BASH_LS)


@needs_sdk
def test_a_session_that_fails_to_open_is_retried_then_fails_the_reset(make, server) -> None:
    env = make(retry_max_attempts=2)
    server.create_failures = 2
    obs, _ = env.reset(seed=1)
    assert obs[0]["content"].startswith("Task 1:")
    assert len(server.open_sessions) == 1  # the two sessions whose set-up failed were deleted
    server.create_failures = 5
    with pytest.raises(
        RuntimeError, match=r"opening task test/Echo:train:3 failed 3 time\(s\); last error .*500.*did not start"
    ):
        env.reset(seed=3)
    assert server.open_sessions == []


@needs_sdk
def test_a_server_side_tool_failure_ends_the_episode(make, server) -> None:
    env = make(nonterminal_reward=-1.0)
    env.reset(seed=0)
    env.step(score(0.5))
    _, reward, terminated, truncated, info = env.step('<tool_call>{"name": "crash", "arguments": {}}</tool_call>')
    assert (reward, terminated, truncated) == (pytest.approx(-0.5), True, True)
    assert info["failure_mode"].startswith("tool_call_failed: crash: ToolFailed:") and "boom" in info["failure_mode"]
    assert server.open_sessions == []


@needs_sdk
def test_a_missing_or_refused_key_and_an_unknown_environment_are_config_errors(make, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="export OPENREWARD_API_KEY="):
        monkeypatch.delenv("OPENREWARD_API_KEY")
        make()
    monkeypatch.setenv("OPENREWARD_API_KEY", "wrong")
    with pytest.raises(ConfigError, match=r"refused OPENREWARD_API_KEY \(HTTP 401\)"):
        make()
    monkeypatch.setenv("OPENREWARD_API_KEY", FAKE_API_KEY)
    with pytest.raises(
        ConfigError, match=r"environment_name='test/echo': the server knows no such environment .*case-sensitive"
    ):
        make(environment_name="test/echo")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"reward_reduction": "median"}, "env_config.reward_reduction"),
        ({"system_prompt_template": "no placeholder"}, "env_config.system_prompt_template.*'{tools}'"),
        ({"max_steps": 0}, "env_config.max_steps"),
        ({"retry_max_attempts": -1}, "env_config.retry_max_attempts"),
        ({"env_name": "x"}, "env_config.env_name"),
        ({"mode": "eval"}, "env_config.mode"),
    ],
)
def test_bad_settings_name_the_key(config, message) -> None:
    with pytest.raises(ConfigError, match=message):
        check_env_config({"environment_name": "test/Echo", **config})
    with pytest.raises(ConfigError, match=message):
        OpenRewardEnv.check_args(environment_name="test/Echo", **config)


def test_rolls_example_settings_and_the_missing_extra(monkeypatch) -> None:
    roll_example = {
        "environment_name": "kanishk/EndlessTerminals",
        "split": "train",
        "mode": "val",
        "max_steps": 16,
        "reward_reduction": "sum",
        "nonterminal_reward": 0.0,
        "retry_max_attempts": 3,
        "retry_backoff_seconds": 5.0,
    }
    assert check_env("openreward_env", roll_example) is OpenRewardEnv
    assert check_env_config(roll_example).reduce([], terminal=False) == 0.0
    monkeypatch.setitem(sys.modules, "openreward", None)
    with pytest.raises(MissingExtraError, match=r"roll-agentic\[openreward\]") as missing:
        OpenRewardEnv.check_args(**roll_example)
    assert missing.value.pip_command == "pip install 'roll-agentic[openreward]'"
    assert str(missing.value).endswith(
        "(with the mcp extra as well, which pip cannot install beside it: "
        "python -m roll.agentic.env.openreward_install)"
    )
    with pytest.raises(MissingExtraError, match=r"roll-agentic\[openreward\]"):
        OpenRewardEnv(**roll_example)


def test_openreward_calls_get_a_long_timeout_unless_set() -> None:
    assert CustomEnvConfig(env_type="openreward_env").step_timeout_s == 900.0  # a session may start a container
    assert CustomEnvConfig(env_type="openreward_env", step_timeout_s=30).step_timeout_s == 30.0
    assert CustomEnvConfig(env_type="frozen_lake").step_timeout_s == 60.0
