"""``llm_proxy.proxy_type: openai``: each turn posted to a local server that mimics an OpenAI completions (or chat)
endpoint."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, LLMProxyConfig
from roll.agentic.policy import GenerateRequest, OpenAIProxyClient
from roll.agentic.scheduler import RolloutScheduler
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig


def request(tokenizer, **config) -> GenerateRequest:
    prompt = tokenizer.encode("Observation: P_G", add_special_tokens=False)
    generation = GenerationConfig(max_new_tokens=12, temperature=0.5, top_p=0.9, **config)
    return GenerateRequest("t/0", prompt, generation, meta={"tag": "Lake"}, seed=7)


def vllm_choice(tokenizer, text: str, finish: str = "stop", stop: str | int | None = None, eos: bool = True) -> dict:
    """A choice as vLLM's /v1/completions gives it with return_token_ids: the sampled ids (here one character per
    token, as a model samples them, not as the text re-tokenizes), EOS among them, the text without it."""
    ids = [i for char in text for i in tokenizer.encode(char, add_special_tokens=False)]
    ids += [tokenizer.eos_token_id] if eos else []
    return {"text": text, "token_ids": ids, "finish_reason": finish, "stop_reason": stop}


def test_sends_the_prompt_ids_and_returns_the_sampled_ids(tokenizer, endpoint) -> None:
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="served")
    choice = vllm_choice(tokenizer, "<answer>Up</answer>")
    assert choice["token_ids"][:-1] != tokenizer.encode(choice["text"], add_special_tokens=False)
    endpoint.replies = [(200, {"choices": [choice]})]
    req = request(tokenizer, stop_strings=["</answer>"])
    result = asyncio.run(client.generate(req))
    body = endpoint.seen[0][1]
    assert body == {
        "model": "served",
        "prompt": req.prompt_ids,
        "max_tokens": 12,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["</answer>"],
        "seed": 7,
        "return_token_ids": True,
    }
    # the ids vLLM sampled, EOS included (its text leaves EOS out), not the text tokenized again
    assert (result.token_ids, result.finish_reason) == (choice["token_ids"], "stop")
    # a stop string: vLLM's text leaves it out, its ids keep the tokens that completed it (and add no EOS)
    cut = vllm_choice(tokenizer, "<answer>Up</answer>", stop="</answer>", eos=False)
    endpoint.replies = [(200, {"choices": [{**cut, "text": "<answer>Up"}]})]
    assert asyncio.run(client.generate(req)).token_ids == cut["token_ids"]
    endpoint.replies = [(200, {"choices": [vllm_choice(tokenizer, "<answer>Left and", finish="length", eos=False)]})]
    result = asyncio.run(client.generate(req))
    assert result.finish_reason == "length" and tokenizer.eos_token_id not in result.token_ids


def test_a_server_without_token_ids_names_the_switch(tokenizer, endpoint) -> None:
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", retry_delay=0.01)
    with pytest.raises(ConfigError, match=r"env tag 'Lake': .* without choices\[0\]\.token_ids.*token_ids: false"):
        asyncio.run(client.generate(request(tokenizer)))
    endpoint.replies = [(400, {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}})]
    with pytest.raises(ConfigError, match=r"HTTP 400: .*return_token_ids.*needs proxy_config.token_ids: false"):
        asyncio.run(client.generate(request(tokenizer)))


def test_text_mode_sends_the_rendered_prompt_and_returns_the_text_tokenized(tokenizer, endpoint, monkeypatch) -> None:
    monkeypatch.setenv("HELPER_KEY", "sk-test")
    client = OpenAIProxyClient(
        tokenizer, base_url=endpoint.url, model_name="served", api_key_env="HELPER_KEY", token_ids=False
    )
    result = asyncio.run(client.generate(request(tokenizer, stop_strings=["</answer>"])))
    path, body, auth = endpoint.seen[0]
    assert (path, auth) == ("/v1/completions", "Bearer sk-test")
    assert body == {
        "model": "served",
        "prompt": "Observation: P_G",
        "max_tokens": 12,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["</answer>"],
        "seed": 7,
    }
    expected = [*tokenizer.encode("<answer>Up</answer>", add_special_tokens=False), tokenizer.eos_token_id]
    assert (result.token_ids, result.finish_reason, result.log_probs) == (expected, "stop", None)
    # vLLM leaves the matched stop string out of the text and names it: it is put back, as roll's engines keep it
    endpoint.replies = [
        (200, {"choices": [{"text": "<answer>Up", "finish_reason": "stop", "stop_reason": "</answer>"}]})
    ]
    again = asyncio.run(client.generate(request(tokenizer, stop_strings=["</answer>"])))
    assert again.token_ids == expected
    endpoint.replies = [(200, {"choices": [{"text": "<answer>Left and on and on", "finish_reason": "length"}]})]
    cut = asyncio.run(client.generate(request(tokenizer)))
    assert cut.finish_reason == "length" and tokenizer.eos_token_id not in cut.token_ids and len(cut.token_ids) <= 12


def test_a_stopped_answer_ends_with_the_templates_end_of_turn_token(tokenizer, endpoint) -> None:
    """A tokenizer whose EOS is not the template's end of turn (Gemma's <eos> and <end_of_turn>, a base Qwen's
    <|endoftext|> and <|im_end|>): text mode ended a stopped answer with the EOS, and the env manager's layout then
    put the template's end of turn after it, so every later prompt sent to the server carried a stray EOS per turn."""
    from roll.agentic.env_manager.chat import turn_end_token_id

    base = copy.deepcopy(tokenizer)
    base.eos_token = "<|endoftext|>"
    end_of_turn = base.convert_tokens_to_ids("<|im_end|>")
    assert turn_end_token_id(tokenizer) == tokenizer.eos_token_id  # the template ends turns with its EOS
    assert turn_end_token_id(base) == end_of_turn != base.eos_token_id
    plain = copy.deepcopy(base)
    plain.chat_template = None
    assert turn_end_token_id(plain) == base.eos_token_id  # no template: EOS
    plain.chat_template = "{{ raise_exception('no conversation renders') }}"  # a template that lays out no turns
    assert turn_end_token_id(plain) == base.eos_token_id

    client = OpenAIProxyClient(base, base_url=endpoint.url, model_name="served", token_ids=False)
    result = asyncio.run(client.generate(request(base)))
    assert result.token_ids == [*base.encode("<answer>Up</answer>", add_special_tokens=False), end_of_turn]
    # with the sampled ids: an answer that stopped on the end of turn at the budget's last token stopped, not cut
    sampled = OpenAIProxyClient(base, base_url=endpoint.url, model_name="served", token_ids=True)
    ids = [*base.encode("<answer>Up</answer>", add_special_tokens=False), end_of_turn]
    endpoint.replies = [
        (200, {"choices": [{"text": "<answer>Up</answer>", "token_ids": ids, "finish_reason": "stop"}]})
    ]
    at_budget = dataclasses.replace(request(base), generation_config=GenerationConfig(max_new_tokens=len(ids)))
    answer = asyncio.run(sampled.generate(at_budget))
    assert (answer.token_ids, answer.finish_reason) == (ids, "stop")


def test_transient_errors_are_retried_then_the_turn_aborts(tokenizer, endpoint) -> None:
    ok = {"choices": [{"text": "<answer>Up</answer>", "finish_reason": "stop"}]}
    endpoint.replies = [(503, {}), (429, {}), (200, ok)]
    client = OpenAIProxyClient(
        tokenizer, base_url=endpoint.url, model_name="m", max_retries=2, retry_delay=0.01, token_ids=False
    )
    assert asyncio.run(client.generate(request(tokenizer))).finish_reason == "stop" and len(endpoint.seen) == 3
    endpoint.replies, endpoint.seen = [(502, {})], []
    result = asyncio.run(client.generate(request(tokenizer)))
    assert (result.finish_reason, result.token_ids, len(endpoint.seen)) == ("abort", [], 3)


def test_a_dropped_body_is_retried_and_a_body_that_is_not_json_names_base_url(tokenizer, endpoint) -> None:
    # a connection dropped mid-body raised http.client.IncompleteRead out of the episode (a worker crash)
    client = OpenAIProxyClient(
        tokenizer, base_url=endpoint.url, model_name="m", max_retries=1, retry_delay=0.01, token_ids=False
    )
    endpoint.cut_after = 5
    result = asyncio.run(client.generate(request(tokenizer)))
    assert (result.finish_reason, len(endpoint.seen)) == ("abort", 2)
    # a web page (or an event stream) where the JSON answer belongs raised a bare JSONDecodeError
    endpoint.cut_after, endpoint.replies = None, [(200, b"<html><body>Model UI</body></html>")]
    with pytest.raises(ConfigError, match=r"env tag 'Lake': .* not a JSON object \('<html>.*base_url must be an "):
        asyncio.run(client.generate(request(tokenizer)))


def test_a_client_error_names_the_tag_and_the_fix(tokenizer, endpoint) -> None:
    endpoint.replies = [(404, {"error": {"message": "model 'nope' does not exist"}})]
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="nope", max_retries=3, retry_delay=0.01)
    with pytest.raises(ConfigError, match=r"env tag 'Lake': .* answered HTTP 404: .*model 'nope' does not exist.*"
                       r"check proxy_config \(base_url, model, api_key\); a chat-only endpoint needs "
                       r"proxy_config.api: chat"):  # fmt: skip
        asyncio.run(client.generate(request(tokenizer)))
    assert len(endpoint.seen) == 1  # not retried
    with pytest.raises(ConfigError, match="base_url 'localhost:8000' must start with http"):
        OpenAIProxyClient(tokenizer, base_url="localhost:8000", model_name="m")
    with pytest.raises(ConfigError, match="api_key_env 'ROLL_NO_SUCH_KEY' is not set"):
        OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api_key_env="ROLL_NO_SUCH_KEY")


def play_lake(tokenizer, proxy_config: dict, *, max_steps: int):
    """Four 4x4 FrozenLake val episodes (2 groups of 2) played by an openai proxy with ``proxy_config``."""
    envs = {"Lake": CustomEnvConfig(env_type="frozen_lake", max_steps=max_steps, env_config={"size": 4})}
    proxy = {"proxy_type": "openai", "proxy_config": proxy_config}
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["Lake"], llm_proxy=proxy)
    scheduler = RolloutScheduler.local(
        config, envs, tokenizer, None, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=2048, mode="val",
    )  # fmt: skip
    try:
        return scheduler.get_batch(4)
    finally:
        scheduler.close()


def test_an_openai_manager_plays_frozen_lake_through_the_scheduler(tokenizer, endpoint) -> None:
    endpoint.replies = [(200, {"choices": [vllm_choice(tokenizer, "<answer>Up</answer>")]})]
    out = play_lake(tokenizer, {"base_url": endpoint.url, "model_name": "m"}, max_steps=3)
    turns = int(sum(out.batch.non_tensor_batch["num_turns"]))
    assert len(out.batch) == 4 and len(endpoint.seen) == turns
    # the prompt sent is roll's rendered context: a later turn's carries the endpoint's earlier answer
    prompts = [tokenizer.decode(body["prompt"], skip_special_tokens=False) for _, body, _ in endpoint.seen]
    later = [prompt for prompt in prompts if "Turn 2:" in prompt]
    assert later and all("<answer>Up</answer>" in prompt.split("Turn 2:")[0] for prompt in later)


def chat_reply(content: str | None, finish: str = "stop") -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": finish}]}


def test_chat_sends_the_messages_and_tokenizes_the_answer(tokenizer, endpoint) -> None:
    endpoint.replies = [(200, chat_reply("<answer>Up</answer>"))]
    client = OpenAIProxyClient(
        tokenizer, base_url=endpoint.url, model_name="hosted", api="chat", enable_thinking=False, max_retries=0
    )
    assert client.wants_messages and client.url.endswith("/v1/chat/completions")
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Observation: P_G"}]
    req = dataclasses.replace(request(tokenizer, stop_strings=["</answer>"]), messages=messages)
    result = asyncio.run(client.generate(req))
    path, body, _ = endpoint.seen[0]
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "hosted",
        "messages": messages,
        "max_tokens": 12,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["</answer>"],
        "seed": 7,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    expected = [*tokenizer.encode("<answer>Up</answer>", add_special_tokens=False), tokenizer.eos_token_id]
    assert (result.token_ids, result.finish_reason, result.log_probs) == (expected, "stop", None)
    endpoint.replies = [(200, chat_reply("<answer>Left and on and on", finish="length"))]
    cut = asyncio.run(client.generate(req))
    assert cut.finish_reason == "length" and tokenizer.eos_token_id not in cut.token_ids and len(cut.token_ids) <= 12
    endpoint.replies = [(200, chat_reply(None))]  # no content and no tool calls: an empty turn that still ended
    assert asyncio.run(client.generate(req)).token_ids == [tokenizer.eos_token_id]
    endpoint.replies = [(200, {"choices": [{"text": "completion-shaped"}]})]
    with pytest.raises(ConfigError, match=r"without choices\[0\]\.message\.content.*serves api: chat"):
        asyncio.run(client.generate(req))
    with pytest.raises(ConfigError, match="api chat needs the turn's messages"):
        asyncio.run(client.generate(request(tokenizer)))
    with pytest.raises(ConfigError, match=r"api 'chats' is not one of \['completions', 'chat'\]"):
        OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chats")
    with pytest.raises(ValueError, match="proxy_config.api 'chats' is not completions"):
        LLMProxyConfig(proxy_type="openai", proxy_config={"base_url": "http://x", "model_name": "m", "api": "chats"})


def test_a_chat_model_that_refuses_max_tokens_gets_max_completion_tokens(tokenizer, endpoint) -> None:
    # OpenAI's reasoning models answer max_tokens with this 400: every turn failed with a ConfigError no setting fixed
    refused = {
        "error": {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            "type": "invalid_request_error",
            "param": "max_tokens",
        }
    }
    answer = {
        "choices": [{"message": {"role": "assistant", "content": "<answer>Up</answer>"}, "finish_reason": "stop"}]
    }
    endpoint.replies = [(400, refused), (200, answer)]
    client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="o4-mini", api="chat", max_retries=0)
    req = dataclasses.replace(request(tokenizer), messages=[{"role": "user", "content": "Observation: P_G"}])
    result = asyncio.run(client.generate(req))
    assert result.finish_reason == "stop" and len(endpoint.seen) == 2
    assert "max_tokens" in endpoint.seen[0][1] and "max_tokens" not in endpoint.seen[1][1]
    assert endpoint.seen[1][1]["max_completion_tokens"] == 12
    asyncio.run(client.generate(req))  # later turns ask with the new key at once
    assert len(endpoint.seen) == 3 and endpoint.seen[2][1]["max_completion_tokens"] == 12
    # a completions endpoint's 400 is not read that way
    endpoint.replies = [(400, refused)]
    with pytest.raises(ConfigError, match="HTTP 400"):
        asyncio.run(OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m").generate(request(tokenizer)))


def test_a_chat_only_endpoint_hints_at_api_chat(tokenizer, endpoint) -> None:
    endpoint.replies = [(404, {"error": {"message": "Not Found"}})]
    for token_ids in (True, False):
        client = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", token_ids=token_ids)
        with pytest.raises(ConfigError, match=r"HTTP 404: .*Not Found.*needs proxy_config.api: chat$"):
            asyncio.run(client.generate(request(tokenizer)))
    chat = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat")
    req = dataclasses.replace(request(tokenizer), messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(ConfigError, match=r"HTTP 404: .*check proxy_config \(base_url, model, api_key\)$"):
        asyncio.run(chat.generate(req))
    assert [path for path, _, _ in endpoint.seen] == ["/v1/completions"] * 2 + ["/v1/chat/completions"]


def test_api_chat_on_a_model_without_a_chat_template_names_both_fixes(tokenizer, endpoint) -> None:
    # vLLM serving a model dir without a chat template answers chat requests with HTTP 400 (its message, below)
    message = (
        "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template "
        "if the tokenizer does not define one."
    )
    endpoint.replies = [(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})]
    chat = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="m", api="chat")
    req = dataclasses.replace(request(tokenizer), messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(
        ConfigError,
        match=r"HTTP 400: .*no longer allowed.*; the served model has no chat template: serve one \(vllm serve "
        r"--chat-template\) or render the prompts with roll, proxy_config.api: completions$",
    ):
        asyncio.run(chat.generate(req))


def test_chat_folds_the_system_message_where_the_runs_template_refuses_it(tokenizer, endpoint) -> None:
    """A template refusing the system role (Gemma 2's) renders the sample with the system text in front of the first
    user message; the chat request sent the system message as it was, which such a served model answers with HTTP 400
    on every turn. The request now holds the conversation the sample holds; a model refusing it anyway names the fix."""
    refusing = copy.deepcopy(tokenizer)
    refusing.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + tokenizer.chat_template
    )
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Observation: P_G"}]
    req = dataclasses.replace(request(refusing), messages=messages)
    endpoint.replies = [(200, chat_reply("<answer>Up</answer>"))]
    client = OpenAIProxyClient(refusing, base_url=endpoint.url, model_name="gemma", api="chat", max_retries=0)
    assert asyncio.run(client.generate(req)).finish_reason == "stop"
    assert endpoint.seen[0][1]["messages"] == [{"role": "user", "content": "Play.\n\nObservation: P_G"}]
    assert req.messages == messages  # the request's own messages are left as they were
    # a run's template that takes the system role sends it; a served model refusing it gets the hint
    error = {"error": {"message": "System role not supported", "type": "BadRequestError", "code": 400}}
    endpoint.replies = [(400, error)]
    taking = OpenAIProxyClient(tokenizer, base_url=endpoint.url, model_name="gemma", api="chat", max_retries=0)
    with pytest.raises(
        ConfigError,
        match=r"HTTP 400: .*; the served model's template refuses the system role: run "
        r"with that model's tokenizer \(model_name_or_path\)",
    ):
        asyncio.run(taking.generate(dataclasses.replace(request(tokenizer), messages=messages)))
    assert endpoint.seen[1][1]["messages"][0] == {"role": "system", "content": "Play."}


def test_a_chat_episode_sends_the_answer_and_the_observation_as_messages(tokenizer, endpoint) -> None:
    endpoint.replies = [(200, chat_reply("<answer>Up</answer>"))]
    out = play_lake(tokenizer, {"base_url": endpoint.url, "model_name": "hosted", "api": "chat"}, max_steps=2)
    assert len(endpoint.seen) == int(sum(out.batch.non_tensor_batch["num_turns"]))
    sent = [body["messages"] for _, body, _ in endpoint.seen]
    firsts = [m for m in sent if "Turn 2:" not in m[-1]["content"]]
    seconds = [m for m in sent if "Turn 2:" in m[-1]["content"]]
    assert seconds and all(m[-1]["role"] == "user" and "Turn 1:" in m[-1]["content"] for m in firsts)
    for second in seconds:
        # the second turn: a first request's messages, the endpoint's answer, the env's next observation
        assert second[:-2] in firsts
        assert second[-2] == {"role": "assistant", "content": "<answer>Up</answer>"}
        assert second[-1]["role"] == "user"
    # the samples are roll's layout: the answer tokenized and ended with EOS, in the rendered conversation
    answer = [*tokenizer.encode("<answer>Up</answer>", add_special_tokens=False), tokenizer.eos_token_id]
    for row in out.batch.batch["responses"]:
        assert [int(i) for i in row[: len(answer)]] == answer
