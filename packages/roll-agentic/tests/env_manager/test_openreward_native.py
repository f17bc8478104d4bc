"""``openreward_env`` played by the agent-native manager (ROLL's example: ``AgentNativeStepEnvManager``), through the
real ``openreward`` SDK against a local fake of OpenReward's server."""

from __future__ import annotations

import json

import pytest

from roll.agentic.config import CustomEnvConfig

pytestmark = pytest.mark.extra("openreward")  # the openreward_server fixture skips without the SDK

ROLL_NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"


def spec(**env_config) -> CustomEnvConfig:
    config = {"environment_name": "test/Echo", "retry_backoff_seconds": 0, **env_config}
    return CustomEnvConfig(env_type="openreward_env", env_config=config, max_steps=4, env_manager_cls=ROLL_NATIVE)


def test_the_native_manager_offers_the_tools_and_plays_the_task(play, scripted, tokenizer, openreward_server) -> None:
    client = scripted(
        [
            '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
            '<tool_call>{"name": "submit", "arguments": {"answer": "42"}}</tool_call>',
        ]
    )
    (result,) = play(spec(), client, seed=3)
    assert (result.end_reason, result.num_turns, result.success) == ("terminated", 2, True)
    assert result.batch.batch["scores"].tolist() == pytest.approx([0.0, 1.0])
    assert [c[:2] for c in openreward_server.calls] == [(3, "bash"), (3, "submit")]
    first, second = (tokenizer.decode(r.prompt_ids) for r in client.requests)
    # the tiny models' template: the server's tools as a system turn, one JSON schema a line
    tools, task = first.split("<|im_end|>\n", 1)
    head, *schemas = tools.split("\n")
    assert head == "<|im_start|>system" and schemas[0] == "# Tools" and schemas[-1] == ""
    assert [json.loads(line)["function"]["name"] for line in schemas[1:-1]] == ["bash", "score", "submit", "crash"]
    assert task == "<|im_start|>user\nTask 3: find the answer and submit it.<|im_end|>\n<|im_start|>assistant\n"
    # the next turn shows the call made and the server's result
    assert second == first + (
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\nran: ls<|im_end|>\n<|im_start|>assistant\n"
    )
    assert openreward_server.open_sessions == []


def test_a_session_that_never_opens_is_an_env_error(play, scripted, openreward_server) -> None:
    openreward_server.create_failures = 10
    (result,) = play(spec(retry_max_attempts=1), scripted(["unused"]))
    assert result.end_reason == "env_error" and result.batch is None
    assert "opening task test/Echo:train:0 failed 2 time(s)" in result.error
    assert openreward_server.open_sessions == []
