"""``openreward_env`` played by the agent-native manager (ROLL's example: ``AgentNativeStepEnvManager``), through the
real ``openreward`` SDK against a local fake of OpenReward's server."""

from __future__ import annotations

import copy

import pytest

from roll.agentic.config import CustomEnvConfig

pytestmark = pytest.mark.extra("openreward")  # the openreward_server fixture skips without the SDK

ROLL_NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"
# ChatML with the tools in their own block and the tool results as `tool` turns.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>tools\n{% for tool in tools %}{{ tool.function.name }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    return tok


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
    assert first == (
        "<|im_start|>tools\nbash\nscore\nsubmit\ncrash\n<|im_end|>\n"
        "<|im_start|>user\nTask 3: find the answer and submit it.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert second.endswith("<|im_start|>tool\nran: ls<|im_end|>\n<|im_start|>assistant\n")
    assert openreward_server.open_sessions == []


def test_a_session_that_never_opens_is_an_env_error(play, scripted, openreward_server) -> None:
    openreward_server.create_failures = 10
    (result,) = play(spec(retry_max_attempts=1), scripted(["unused"]))
    assert result.end_reason == "env_error" and result.batch is None
    assert "opening task test/Echo:train:0 failed 2 time(s)" in result.error
    assert openreward_server.open_sessions == []
