"""ROLL's AgentNativeStepEnvManager: message-list observations rendered with tools, tool-call replies, step rows."""

from __future__ import annotations

import json

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env import make_env
from roll.agentic.env.tool_calls import assistant_message, normalize_messages, parse_native_tool_calls
from roll.agentic.env_manager import render_messages
from roll.agentic.policy import MockPolicyClient, RandomActionPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.strategies import GenerationConfig

ROLL_NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move the player.",
            "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "Play Sokoban."},
    {"role": "user", "content": [{"type": "text", "text": "Room: #P_#"}, {"type": "text", "text": " go"}]},
    {
        "role": "assistant",
        "content": "I move.",
        "tool_calls": [
            {"type": "function", "id": "move_0", "function": {"name": "move", "arguments": '{"direction": "Up"}'}}
        ],
    },
    {"role": "tool", "content": "moved"},
    {"role": "user", "content": "Next?"},
]


class CounterToolEnv:
    """An agent-native env with one tool: call add(n) until the total is 3 (+1); a reply that is neither a parsed
    call nor "done" costs 0.1; "done" early ends the episode with 0."""

    def reset(self, seed=None):
        self.total = 0
        self.messages = [{"role": "system", "content": "Reach 3."}, {"role": "user", "content": "Start at 0."}]
        return list(self.messages), {"tools": TOOLS_ADD}

    def step(self, action):
        turn = assistant_message(action)
        self.messages.append(turn.message)
        reward, done = (0.0, False) if turn.valid else (-0.1, False)
        if turn.valid and not turn.tool_calls:
            done = True
        for call in turn.tool_calls:
            self.total += int(json.loads(call["function"]["arguments"]).get("n", 0))
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"total={self.total}"})
        if self.total >= 3:
            reward, done = 1.0, True
        return list(self.messages), reward, done, False, {"action_is_valid": turn.valid, "success": self.total == 3}


TOOLS_ADD = [
    {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    }
]


def test_tool_calls_drive_the_env(play, scripted, tokenizer) -> None:
    from roll.agentic.env import register_env

    register_env("test_counter_tool", CounterToolEnv)
    spec = CustomEnvConfig(env_type="test_counter_tool", max_steps=4, env_manager_cls="agent_native")
    responses = [
        '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"n": </tool_call>',
        '<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>',
    ]
    client = scripted(responses)
    (result,) = play(spec, client)
    assert result.num_turns == 3 and result.end_reason == "terminated" and result.success
    assert result.batch.batch["scores"].tolist() == pytest.approx([0.0, -0.1, 1.0])
    # The third prompt: tools block, the parsed call of turn 1 and its tool result, the malformed reply as text.
    env = CounterToolEnv()
    messages, _ = env.reset()
    for response in responses[:2]:
        messages, *_ = env.step(response)
    third = client.requests[2].prompt_ids
    assert third == render_messages(tokenizer, messages, TOOLS_ADD, False)
    text = tokenizer.decode(third)
    assert text.startswith('<|im_start|>system\n# Tools\n{"type": "function", "function": {"name": "add"')
    assert '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\ntotal=2<|im_end|>" in text


def test_prompt_ids_are_the_chat_template_with_tools(tokenizer) -> None:
    ids = render_messages(tokenizer, MESSAGES, TOOLS, parse_tool_call_arguments=False)
    flat = normalize_messages(MESSAGES)
    assert ids == list(tokenizer.apply_chat_template(flat, tools=TOOLS, add_generation_prompt=True, return_dict=False))
    text = tokenizer.decode(ids)
    assert text.startswith('<|im_start|>system\n# Tools\n{"type": "function", "function": {"name": "move"')
    assert "<|im_start|>user\nRoom: #P_# go<|im_end|>" in text
    assert '<tool_call>{"name": "move", "arguments": {"direction": "Up"}}</tool_call>' in text
    assert text.endswith("<|im_start|>user\nNext?<|im_end|>\n<|im_start|>assistant\n")
    # ROLL's parse_tool_call_parameter_to_dict: arguments become dicts (rendered by the template's tojson).
    parsed = normalize_messages(MESSAGES, parse_arguments=True)
    assert parsed[2]["tool_calls"][0]["function"]["arguments"] == {"direction": "Up"}
    assert MESSAGES[2]["tool_calls"][0]["function"]["arguments"] == '{"direction": "Up"}'  # input untouched


def test_normalize_messages_falls_back_on_unparsable_arguments() -> None:
    bad = [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    (out,) = normalize_messages(bad, parse_arguments=True)
    assert "tool_calls" not in out and out["content"] == "x[{'function': {'name': 'f', 'arguments': '{oops'}}]"
    assert normalize_messages([{"role": "user", "content": None}])[0]["content"] == "None"


def test_reply_parsing_follows_roll() -> None:
    valid = assistant_message('Go up.<tool_call>{"name": "move", "arguments": {"direction": "Up"}}</tool_call>')
    assert valid.valid and valid.message == {
        "role": "assistant",
        "content": "Go up.",
        "tool_calls": [
            {"type": "function", "id": "move_0", "function": {"name": "move", "arguments": '{"direction": "Up"}'}}
        ],
    }
    malformed = assistant_message('<tool_call>{"name": "move", "arguments": {"direction": </tool_call>')
    assert not malformed.valid and malformed.tool_calls == []
    assert malformed.message["content"] == '<tool_call>{"name": "move", "arguments": {"direction": </tool_call>'
    plain = assistant_message("<answer>Up</answer>")
    assert plain.valid and plain.message == {"role": "assistant", "content": "<answer>Up</answer>"}
    # Qwen3-Coder's XML form, values coerced; a missing </tool_call> is tolerated; one bad block of two is skipped.
    xml = parse_native_tool_calls(
        "<tool_call><function=move><parameter=steps>2</parameter><parameter=fast>true</parameter>"
    )
    assert xml == []  # no complete <function=...></function> block
    xml = parse_native_tool_calls(
        "<tool_call><function=move>\n<parameter=steps>2</parameter>\n<parameter=fast>true</parameter>\n"
        "<parameter=to>[1, 2]</parameter></function></tool_call>"
    )
    assert xml is not None and json.loads(xml[0]["function"]["arguments"]) == {"steps": 2, "fast": True, "to": [1, 2]}
    two = parse_native_tool_calls(
        '<tool_call>{bad}</tool_call><tool_call>{"name": "move", "arguments": {}}</tool_call>'
    )
    assert two is not None and [c["id"] for c in two] == ["move_1"]
    assert parse_native_tool_calls("no calls") is None


def test_an_unclosed_last_call_after_closed_ones_is_read() -> None:
    # the model stopped right after the second call's JSON: that call was dropped, the reply read as one move
    reply = (
        '<tool_call>{"name": "move", "arguments": {"direction": "Up"}}</tool_call>\n'
        '<tool_call>{"name": "move", "arguments": {"direction": "Left"}}'
    )
    calls = assistant_message(reply).tool_calls
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"direction": "Up"}, {"direction": "Left"}]
    assert [c["id"] for c in calls] == ["move_0", "move_1"]


def test_arguments_written_as_a_json_string_are_not_encoded_twice() -> None:
    # they became the JSON string of a string: an env's json.loads got a str (openreward forwarded it as the
    # arguments), and the template rendered the call as a quoted string
    (call,) = parse_native_tool_calls(
        '<tool_call>{"name": "move", "arguments": "{\\"direction\\": \\"Up\\"}"}</tool_call>'
    )
    assert json.loads(call["function"]["arguments"]) == {"direction": "Up"}
    (empty,) = parse_native_tool_calls('<tool_call>{"name": "look", "arguments": ""}</tool_call>')
    assert json.loads(empty["function"]["arguments"]) == {}


def test_function_tags_in_a_json_call_do_not_hide_it() -> None:
    # "<function" anywhere read the reply as Qwen3-Coder XML, which found nothing: the JSON calls were dropped
    reply = (
        "The page defines <function> elements.\n"
        '<tool_call>{"name": "python", "arguments": {"code": "print(\'<function=f>\')"}}</tool_call>\n'
        '<tool_call>{"name": "move", "arguments": {"direction": "Up"}}</tool_call>'
    )
    turn = assistant_message(reply)
    assert turn.valid and [c["function"]["name"] for c in turn.tool_calls] == ["python", "move"]
    assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"code": "print('<function=f>')"}
    # Qwen3-Coder blocks still read, beside JSON ones, with distinct ids
    mixed = parse_native_tool_calls(
        "<tool_call>\n<function=move>\n<parameter=direction>\nUp\n</parameter>\n</function>\n</tool_call>"
        '<tool_call>{"name": "move", "arguments": {"direction": "Left"}}</tool_call>'
    )
    assert mixed is not None and [c["id"] for c in mixed] == ["move_0", "move_1"]
    assert [json.loads(c["function"]["arguments"])["direction"] for c in mixed] == ["Up", "Left"]
    bare = parse_native_tool_calls("<function=move><parameter=direction>Up</parameter></function>")
    assert bare is not None and json.loads(bare[0]["function"]["arguments"]) == {"direction": "Up"}


def test_a_stray_opening_tag_does_not_swallow_the_call_after_it() -> None:
    reply = '<think>Use a <tool_call> block.</think><tool_call>{"name": "move", "arguments": {"direction": "Up"}}'
    turn = assistant_message(reply)
    assert turn.valid and [json.loads(c["function"]["arguments"]) for c in turn.tool_calls] == [{"direction": "Up"}]


def test_llama_style_parameters_are_the_arguments() -> None:
    (call,) = parse_native_tool_calls('<tool_call>{"name": "move", "parameters": {"direction": "Up"}}</tool_call>')
    assert json.loads(call["function"]["arguments"]) == {"direction": "Up"}


def test_an_assistant_turn_with_null_content_renders_no_none(tokenizer) -> None:
    # OpenAI writes content null next to tool_calls: the prompt showed the model "None<tool_call>..."
    call = {"id": "move_0", "type": "function", "function": {"name": "move", "arguments": '{"direction": "Up"}'}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "move_0", "content": "moved"},
    ]
    for parse_arguments in (False, True):
        text = tokenizer.decode(render_messages(tokenizer, messages, TOOLS, parse_arguments))
        assert "<|im_start|>assistant\n<tool_call>" in text and "None" not in text


def test_sokoban_native_env_messages_and_penalty() -> None:
    env = make_env("sokoban_native_env", max_steps=3, format_penalty=-0.15, search_depth=30)
    messages, info = env.reset(seed=3)
    assert info["tools"] == [] and [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("You're a helpful assistant.") and "Sokoban" in messages[0]["content"]
    assert messages[1]["content"].startswith("Here is the current state:\n")
    messages, reward, terminated, _, info = env.step("I think so")
    assert reward == pytest.approx(-0.1 - 0.15) and not info["action_is_valid"] and not terminated
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == "I think so" and "the last action is not valid" in messages[3]["content"]
    messages, reward, _, _, info = env.step("<answer>Up</answer>")
    assert info["action_is_valid"] and "not valid" not in messages[5]["content"]
    assert messages[5]["content"].startswith("Current state:\n")


NATIVE = CustomEnvConfig(
    env_type="sokoban_native_env",
    env_config={"max_steps": 3, "format_penalty": -0.15, "search_depth": 30},
    max_steps=3,
    max_tokens_per_step=32,
    env_manager_cls=ROLL_NATIVE,
    agent_template="agent_template placeholder",
)


def test_manager_renders_the_env_messages_each_turn(play, scripted, tokenizer) -> None:
    assert NATIVE.env_manager_cls == "agent_native"
    responses = ["<answer>Up</answer>", "no idea", "<answer>Left</answer>"]
    client = scripted(responses)
    (result,) = play(NATIVE, client, seed=7)
    assert result.num_turns == 3 and result.end_reason in ("truncated", "terminated")
    # Replay: every request is the chat template of the env's message list at that turn (tools: []).
    env = make_env("sokoban_native_env", max_steps=3, format_penalty=-0.15, search_depth=30)
    messages, _ = env.reset(seed=7)
    rewards = []
    for request, response in zip(client.requests, responses, strict=True):
        assert request.prompt_ids == list(
            tokenizer.apply_chat_template(messages, tools=[], add_generation_prompt=True, return_dict=False)
        )
        messages, reward, *_ = env.step(response)
        rewards.append(reward)
    batch = result.batch
    columns = batch.non_tensor_batch
    assert len(batch) == 3 and columns["step"].tolist() == [0, 1, 2]
    assert batch.batch["scores"].tolist() == pytest.approx(rewards) and rewards[1] == pytest.approx(-0.25)
    assert columns["episode_scores"].tolist() == pytest.approx([sum(rewards)] * 3)
    for i, response in enumerate(responses):
        mask = batch.batch["response_mask"][i].bool()
        assert tokenizer.decode(batch.batch["responses"][i][mask]) == response + tokenizer.eos_token
    assert len(set(columns["state_hash"].tolist())) == 3  # the message list grows every turn
    assert result.format_ratio == pytest.approx(2 / 3)


def test_sokoban_tool_call_offers_move_player_and_renders_the_answered_calls(play, scripted, tokenizer) -> None:
    from roll.agentic.env.sokoban_tool_call import MOVE_PLAYER

    config = {"max_steps": 3, "format_penalty": -0.15, "search_depth": 30}
    spec = CustomEnvConfig(env_type="sokoban_tool_call", env_config=config, max_steps=3, env_manager_cls="agent_native")
    responses = [
        '<tool_call>{"name": "move_player", "arguments": {"direction": "up"}}</tool_call>',
        "up",
        '<tool_call>{"name": "move_player", "arguments": {"direction": "down"}}</tool_call>',
    ]
    client = scripted(responses)
    (result,) = play(spec, client, seed=7)
    env = make_env("sokoban_tool_call", **config)
    messages, _ = env.reset(seed=7)
    rewards = []
    for request, response in zip(client.requests, responses, strict=True):
        assert request.prompt_ids == render_messages(tokenizer, messages, [MOVE_PLAYER], False)
        messages, reward, *_ = env.step(response)
        rewards.append(reward)
    assert result.batch.batch["scores"].tolist() == pytest.approx(rewards) and rewards[1] == pytest.approx(-0.25)
    third = tokenizer.decode(client.requests[2].prompt_ids)
    assert third.startswith('<|im_start|>system\n# Tools\n{"type": "function", "function": {"name": "move_player"')
    assert '<tool_call>{"name": "move_player", "arguments": {"direction": "up"}}</tool_call><|im_end|>' in third
    assert "<|im_start|>tool\nMoved up" in third and "<|im_start|>user\nNo move_player call found" in third
    assert result.format_ratio == pytest.approx(2 / 3)


def test_malformed_observation_is_an_env_fault(play, scripted) -> None:
    spec = NATIVE.model_copy(update={"env_type": "sokoban"})  # text observations under the native manager
    (result,) = play(spec, scripted(["<answer>Up</answer>"]))
    assert result.end_reason == "env_malformed" and "list of chat messages" in result.error


def test_scheduler_step_wise_samples(tokenizer) -> None:
    client = MockPolicyClient(tokenizer, RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.3))
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["SN"])
    scheduler = RolloutScheduler.local(
        config,
        {"SN": NATIVE},
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=32),
        sequence_length=2048,
        mode="train",
        seed=0,
    )
    try:
        out = scheduler.get_batch(4)
    finally:
        scheduler.close()
    turns = {e.task.traj_id: e.num_turns for e in out.episodes}
    assert len(turns) == 4 and len(out.batch) == sum(turns.values())
    columns = out.batch.non_tensor_batch
    for traj, n in turns.items():
        rows = [i for i, t in enumerate(columns["traj_id"]) if t == traj]
        assert [columns["step"][i] for i in rows] == list(range(n))
        scores = [float(out.batch.batch["scores"][i]) for i in rows]
        assert scores == pytest.approx([columns["step_scores"][i] for i in rows])
        assert all(columns["episode_scores"][i] == pytest.approx(sum(scores)) for i in rows)
    assert all(s <= -0.1 + 1e-9 or s > 0 for s in columns["step_scores"])  # a move costs 0.1 unless it scores


def test_rock_env_config_is_checked_at_load() -> None:
    # rock_tb_native_env is supported (tests/env/test_rock_env.py); its env_config is checked when the config loads.
    with pytest.raises(ValueError, match=r"env_config.dataset_name: Field required"):
        CustomEnvConfig(env_type="rock_tb_native_env", env_manager_cls=ROLL_NATIVE)


def test_parse_tool_call_parameter_to_dict_reaches_every_env() -> None:
    from roll.agentic.config import spread_parse_tool_call

    data = {
        "parse_tool_call_parameter_to_dict": True,
        "custom_envs": {"A": {"env_type": "sokoban_native_env"}, "B": {"parse_tool_call_arguments": False}},
    }
    envs = spread_parse_tool_call(data)["custom_envs"]
    assert envs["A"]["parse_tool_call_arguments"] is True and envs["B"]["parse_tool_call_arguments"] is False
    assert CustomEnvConfig(**envs["A"], env_manager_cls="agent_native").parse_tool_call_arguments is True
