"""``llm_proxy`` openai with ``api: chat`` and tool envs: structured tool calls in, the env's text out, and a history
that OpenAI's chat API accepts (the local endpoint refuses what OpenAI would, conftest.chat_schema_error)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env import register_env
from roll.agentic.env.math_tool import ArithmeticEnv
from roll.agentic.env.tool_calls import assistant_message
from roll.agentic.policy import GenerateRequest, OpenAIProxyClient
from roll.agentic.policy.chat_messages import openai_messages
from roll.agentic.policy.protocol import ChatTools
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.tools import format_tool_call, tool_wrapper
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig


def chat_reply(content: str | None, calls: list[tuple[str, str]] = ()) -> dict:
    """A chat answer; ``calls`` (name, arguments JSON) as structured ``tool_calls`` with the server's own ids."""
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"chatcmpl-tool-{i}x", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)
        ]
    return {"choices": [{"message": message, "finish_reason": "tool_calls" if calls else "stop"}]}


def python_tools(tool_format: str = "hermes") -> ChatTools:
    return tool_wrapper(ArithmeticEnv(), {"tool_format": tool_format}, [{"tool_id": "python_code"}]).chat_tools()


def chat_request(tokenizer, tools: ChatTools | None) -> GenerateRequest:
    messages = [{"role": "user", "content": "What is 12 * 34?"}]
    return GenerateRequest("t/0", [1, 2], GenerationConfig(max_new_tokens=64), {"tag": "Math"}, 7, messages, tools)


def test_structured_calls_become_the_env_format_and_the_sample_is_that_text(tokenizer, endpoint) -> None:
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="hosted", api="chat", max_retries=0)
    code = json.dumps({"code": "print(12 * 34)"})
    endpoint.replies = [(200, chat_reply("Let me run it.", [("python_code", code)]))]
    tools = python_tools()
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    body = endpoint.seen[0][1]
    assert body["tools"] == tools.schemas
    assert [tool["function"]["name"] for tool in body["tools"]] == ["python_code"]
    text = 'Let me run it.\n<tool_call>{"name": "python_code", "arguments": {"code": "print(12 * 34)"}}</tool_call>'
    assert result.token_ids == [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert (result.finish_reason, result.content) == ("stop", "Let me run it.")
    assert result.tool_calls == [{"name": "python_code", "arguments": code}]
    # GEM's format: the python tool's own tag, which the wrapper reads back as the same call
    gem = python_tools("gem")
    endpoint.replies = [(200, chat_reply(None, [("python_code", code)]))]
    result = asyncio.run(client.generate(chat_request(tokenizer, gem)))
    assert tokenizer.decode(result.token_ids, skip_special_tokens=True) == "<python>print(12 * 34)</python>"
    # arguments that are not JSON reach the env as written: it reports a failed call, nothing is dropped
    endpoint.replies = [(200, chat_reply(None, [("python_code", '{"code": ')]))]
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    assert tokenizer.decode(result.token_ids, skip_special_tokens=True) == (
        '<tool_call>{"name": "python_code", "arguments": "{\\"code\\": "}</tool_call>'
    )
    # written out, the calls may outgrow the turn's budget: cut there, as an answer that hit max_tokens
    endpoint.replies = [(200, chat_reply(None, [("python_code", code)] * 3))]
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    assert (len(result.token_ids), result.finish_reason, result.tool_calls) == (64, "length", None)
    # cut by max_tokens inside a call (OpenAI answers the unfinished arguments with finish_reason length): the answer
    # was taken as stopped, EOS added and the broken call kept in the history as a structured one
    cut = chat_reply(None, [("python_code", '{"code": "print(12 *')])
    cut["choices"][0]["finish_reason"] = "length"
    endpoint.replies = [(200, cut)]
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    assert (result.finish_reason, result.tool_calls) == ("length", None)
    assert tokenizer.eos_token_id not in result.token_ids
    endpoint.replies = [(200, {"choices": [{"message": {"content": None, "tool_calls": [{"type": "function"}]}}]})]
    with pytest.raises(ConfigError, match=r"env tag 'Math': .* answered tool_calls\[0\] without function\.name"):
        asyncio.run(client.generate(chat_request(tokenizer, tools)))


def test_chat_with_token_ids_takes_the_sampled_ids_as_vllm_answers_them(tokenizer, endpoint) -> None:
    # vLLM's chat answer with return_token_ids: content null next to the parsed calls, its own call ids,
    # finish_reason "tool_calls" however the answer ended, and the ids as sampled (compact JSON, text after the call)
    sampled_text = '<tool_call>{"name":"python_code","arguments":{"code":"print(12*34)"}}</tool_call> ok'
    sampled = [*tokenizer.encode(sampled_text, add_special_tokens=False), tokenizer.eos_token_id]
    reply = chat_reply(None, [("python_code", json.dumps({"code": "print(12*34)"}))])
    reply["choices"][0] |= {"token_ids": sampled, "stop_reason": None}
    endpoint.replies = [(200, reply)]
    tools = python_tools()
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat", token_ids=True)
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    assert endpoint.seen[0][1]["return_token_ids"] is True
    assert (result.token_ids, result.finish_reason) == (sampled, "stop")
    assert result.tool_calls == [{"name": "python_code", "arguments": '{"code": "print(12*34)"}'}]
    assert result.content == ""
    # cut by max_tokens after a whole call: vLLM still says "tool_calls"; the sample is cut, no EOS added
    cut = sampled[:-1] + [sampled[0]] * (64 - len(sampled) + 1)
    reply["choices"][0] |= {"token_ids": cut}
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    assert (result.token_ids, result.finish_reason) == (cut, "length")
    # chat's default stays the text path (a hosted API refuses return_token_ids): the calls rewritten, EOS added
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat")
    result = asyncio.run(client.generate(chat_request(tokenizer, tools)))
    assert "return_token_ids" not in endpoint.seen[-1][1]
    text = '<tool_call>{"name": "python_code", "arguments": {"code": "print(12*34)"}}</tool_call>'
    assert result.token_ids == [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    # a chat server that ignores return_token_ids is named, with the switch
    endpoint.replies = [(200, chat_reply("4"))]
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat", token_ids=True)
    with pytest.raises(ConfigError, match=r"without choices\[0\]\.token_ids.*token_ids: false"):
        asyncio.run(client.generate(chat_request(tokenizer, tools)))


def test_an_endpoint_refusing_tools_names_native_tools_false(tokenizer, endpoint) -> None:
    endpoint.replies = [(400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}})]
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat", max_retries=0)
    with pytest.raises(ConfigError, match=r"HTTP 400: .*auto.* tool choice.*needs proxy_config.native_tools: false$"):
        asyncio.run(client.generate(chat_request(tokenizer, python_tools())))
    text = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat", native_tools=False)
    endpoint.replies = [(200, chat_reply("<answer>408</answer>"))]
    asyncio.run(text.generate(chat_request(tokenizer, python_tools())))
    assert "tools" not in endpoint.seen[-1][1]
    with pytest.raises(ConfigError, match="native_tools 'yes' must be true or false"):
        OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat", native_tools="yes")


CALL = {"id": "call_0_0", "type": "function", "function": {"name": "python_code", "arguments": '{"code": "1"}'}}


def test_history_is_sent_natively_where_it_can_be_and_as_text_where_not(chat_schema_error) -> None:
    tools = python_tools()
    user = {"role": "user", "content": "What is 12 * 34?"}
    native = [user, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    native.append({"role": "tool", "tool_call_id": "call_0_0", "content": "python_code result:\n1"})
    sent = openai_messages(native, tools)
    assert sent[1] == {"role": "assistant", "content": None, "tool_calls": [CALL]} and sent[2] == native[2]
    assert chat_schema_error({"messages": sent}) is None
    # one result for two calls (the env answered both at once), a dict argument, or native_tools false: text
    two = {"role": "assistant", "content": "Run.", "tool_calls": [CALL, {**CALL, "id": "call_0_1"}]}
    unmatched = [user, two, {"role": "tool", "content": "python_code result:\n1\npython_code result:\n1"}]
    text = f"Run.\n{format_tool_call('python_code', {'code': '1'})}\n{format_tool_call('python_code', {'code': '1'})}"
    assert openai_messages(unmatched, tools) == [
        user,
        {"role": "assistant", "content": text},
        {"role": "user", "content": unmatched[2]["content"]},
    ]
    assert chat_schema_error({"messages": openai_messages(unmatched, tools)}) is None
    assert openai_messages(native, tools, native=False)[1:] == [
        {"role": "assistant", "content": format_tool_call("python_code", {"code": "1"})},
        {"role": "user", "content": "python_code result:\n1"},
    ]
    dict_arguments = {**CALL, "function": {"name": "python_code", "arguments": {"code": "1"}}}
    assert openai_messages([user, {**native[1], "tool_calls": [dict_arguments]}, native[2]], tools)[1] == sent[1]
    # an assistant answer with empty (OpenAI refuses it) or null tool_calls goes without the key
    for empty in ([], None):
        plain = [user, {"role": "assistant", "content": "<answer>408</answer>", "tool_calls": empty}, user]
        assert openai_messages(plain, tools)[1] == {"role": "assistant", "content": "<answer>408</answer>"}
        assert chat_schema_error({"messages": openai_messages(plain, tools)}) is None
    # ids an earlier turn sent (an env numbering each turn's calls from 0) get a suffix no message holds
    again = [{**CALL, "id": "call_0_0-1"}]
    turns = [
        user,
        *native[1:],
        {**native[1]},
        native[2],
        {**native[1], "tool_calls": again},
        {**native[2], "tool_call_id": "call_0_0-1"},
    ]
    sent_ids = [m["tool_call_id"] for m in openai_messages(turns, tools) if m["role"] == "tool"]
    assert sent_ids == ["call_0_0", "call_0_0-2", "call_0_0-1"]
    assert chat_schema_error({"messages": openai_messages(turns, tools)}) is None
    assert "Duplicate value for 'tool_call_id'" in chat_schema_error({"messages": turns})
    # a tool message that answers no call (a trajectory manager's text-mode result) goes as a user message
    assert openai_messages([user, {"role": "tool", "content": "42"}], None)[1] == {"role": "user", "content": "42"}
    # the checker refuses what OpenAI refuses: an unanswered call, an unknown id, a bad tools entry
    assert "not answered" in chat_schema_error({"messages": native[:2]})
    bad_id = [*native[:2], {**native[2], "tool_call_id": "other"}]
    assert "answers no tool_calls" in chat_schema_error({"messages": bad_id})
    assert "name" in chat_schema_error(
        {"messages": [user], "tools": [{"type": "function", "function": {"name": "a b"}}]}
    )


def solve(body: dict) -> dict:
    """A hosted model that calls the python tool on the question, then answers with the tool's output."""
    last = body["messages"][-1]
    if last["content"].startswith("python_code result:"):  # a tool message, or (native_tools false) a user one
        return chat_reply(f"<answer>{last['content'].split()[-1]}</answer>")
    question = re.search(r"What is ([\d +*-]+)\?", last["content"])
    assert question is not None, last
    return chat_reply(None, [("python_code", json.dumps({"code": f"print({question.group(1)})"}))])


def play(tokenizer, spec: CustomEnvConfig, proxy_config: dict, episodes: int = 2):
    proxy = {"proxy_type": "openai", "proxy_config": {"api": "chat", "max_retries": 0, **proxy_config}}
    config = EnvManagerConfig(num_env_groups=episodes, group_size=1, tags=["Math"], llm_proxy=proxy)
    scheduler = RolloutScheduler.local(
        config, {"Math": spec}, tokenizer, None, generation_config=GenerationConfig(max_new_tokens=64),
        sequence_length=2048, mode="val",
    )  # fmt: skip
    try:
        return scheduler.get_batch(episodes)
    finally:
        scheduler.close()


TOOL_MATH = CustomEnvConfig(env_type="tool_math", max_steps=3, env_config={"digits": 2, "operators": "*"})


def test_a_tool_math_episode_calls_the_tool_natively_and_scores(tokenizer, endpoint) -> None:
    endpoint.answer = solve
    out = play(tokenizer, TOOL_MATH, {"base_url": endpoint.url, "model_name": "hosted"})
    columns = out.batch.non_tensor_batch
    assert list(columns["success"]) == [True, True] and list(columns["num_turns"]) == [2, 2]
    assert list(columns["episode_scores"]) == [1.0, 1.0]
    bodies = [body for _, body, _ in endpoint.seen]
    assert len(bodies) == 4 and all(body["tools"] == python_tools().schemas for body in bodies)
    seconds = [body["messages"] for body in bodies if body["messages"][-1]["role"] == "tool"]
    assert len(seconds) == 2
    for messages in seconds:
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
        question = re.search(r"What is ([\d *]+)\?", messages[1]["content"]).group(1)
        value = eval(question)  # two 2-digit factors
        call = messages[2]["tool_calls"][0]
        assert messages[2] == {"role": "assistant", "content": None, "tool_calls": [call]}
        # roll's id, the same every run (the server's own "chatcmpl-tool-0x" is not sent back)
        assert call == {
            "id": "call_0_0",
            "type": "function",
            "function": {"name": "python_code", "arguments": json.dumps({"code": f"print({question})"})},
        }
        assert messages[3] == {"role": "tool", "tool_call_id": "call_0_0", "content": f"python_code result:\n{value}\n"}
    # the sample's first response tokens are the call as the env read it, ended with EOS
    written = [
        [*tokenizer.encode(format_tool_call("python_code", json.loads(m[2]["tool_calls"][0]["function"]["arguments"])),
                           add_special_tokens=False), tokenizer.eos_token_id]
        for m in seconds
    ]  # fmt: skip
    firsts = [[int(i) for i in row[: len(written[0])]] for row in out.batch.batch["responses"]]
    assert sorted(firsts) == sorted(written)
    # the same seeds send the same requests
    first_run = sorted(json.dumps(body, sort_keys=True) for body in bodies)
    endpoint.seen = []
    play(tokenizer, TOOL_MATH, {"base_url": endpoint.url, "model_name": "hosted"})
    assert sorted(json.dumps(body, sort_keys=True) for _, body, _ in endpoint.seen) == first_run


def test_a_step_wise_manager_offers_the_tools_and_keeps_the_written_call_in_its_history(tokenizer, endpoint) -> None:
    endpoint.answer = solve  # it never sees a tool message here: it calls the tool every turn
    spec = CustomEnvConfig(
        **TOOL_MATH.model_dump(include={"env_type", "max_steps", "env_config"}), env_manager_cls="step"
    )
    out = play(tokenizer, spec, {"base_url": endpoint.url, "model_name": "hosted"}, 1)
    assert list(out.batch.non_tensor_batch["step"]) == [0, 1, 2]
    bodies = [body for _, body, _ in endpoint.seen]
    assert len(bodies) == 3 and all(body["tools"] == python_tools().schemas for body in bodies)
    assert all([m["role"] for m in body["messages"]] == ["system", "user"] for body in bodies)
    question = re.search(r"What is ([\d *]+)\?", bodies[0]["messages"][1]["content"]).group(1)
    assert (
        f"action: {format_tool_call('python_code', {'code': f'print({question})'})}"
        in bodies[1]["messages"][1]["content"]
    )


def test_native_tools_false_sends_the_calls_and_results_as_text(tokenizer, endpoint) -> None:
    endpoint.answer = solve
    out = play(tokenizer, TOOL_MATH, {"base_url": endpoint.url, "model_name": "m", "native_tools": False}, 1)
    assert list(out.batch.non_tensor_batch["success"]) == [True]
    first, second = (body for _, body, _ in endpoint.seen)
    assert "tools" not in first and "tools" not in second
    assert second["messages"][2]["content"].startswith('<tool_call>{"name": "python_code", "arguments": {"code": ')
    assert second["messages"][3]["role"] == "user" and second["messages"][3]["content"].startswith("python_code result")


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add n to the total.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}


class AddEnv:
    """An agent-native env: call add(n) to reach 3, then say "done" (reward 1 when the total is 3)."""

    def reset(self, seed=None):
        self.total = 0
        self.messages = [{"role": "user", "content": "Reach 3 with the add tool, then say done."}]
        return list(self.messages), {"tools": [ADD]}

    def step(self, action):
        turn = assistant_message(action)
        self.messages.append(turn.message)
        for call in turn.tool_calls:
            self.total += int(json.loads(call["function"]["arguments"])["n"])
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"total={self.total}"})
        done = turn.valid and not turn.tool_calls
        info = {"action_is_valid": turn.valid, "success": done and self.total == 3}
        return list(self.messages), float(done and self.total == 3), done, False, info


def test_an_agent_native_env_gets_its_tools_and_its_own_call_ids(tokenizer, endpoint) -> None:
    register_env("test_add_native", AddEnv)
    spec = CustomEnvConfig(env_type="test_add_native", max_steps=3, env_manager_cls="agent_native")
    endpoint.answer = lambda body: (
        chat_reply("done") if body["messages"][-1]["role"] == "tool" else chat_reply(None, [("add", '{"n": 3}')])
    )
    out = play(tokenizer, spec, {"base_url": endpoint.url, "model_name": "hosted"}, 1)
    assert list(out.batch.non_tensor_batch["success"]) == [True, True] and len(endpoint.seen) == 2
    first, second = (body for _, body, _ in endpoint.seen)
    assert first["tools"] == second["tools"] == [ADD]
    # the env read the written call back (assistant_message), and its messages answer the call by the env's id
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "add_0", "type": "function", "function": {"name": "add", "arguments": '{"n": 3}'}}],
        },
        {"role": "tool", "tool_call_id": "add_0", "content": "total=3"},
    ]


def test_completions_requests_carry_no_messages_or_tools(tokenizer, endpoint) -> None:
    endpoint.replies = [(200, {"choices": [{"text": "<answer>408</answer>", "finish_reason": "stop"}]})]
    out = play(tokenizer, TOOL_MATH, {"base_url": endpoint.url, "model_name": "m", "api": "completions",
                                      "token_ids": False}, 1)  # fmt: skip
    assert len(out.batch) == 1
    assert all(set(body) == {"model", "prompt", "max_tokens", "temperature", "top_p", "seed"} for _, body, _ in
               endpoint.seen)  # fmt: skip
