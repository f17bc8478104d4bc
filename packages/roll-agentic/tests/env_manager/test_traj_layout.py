"""Trajectory-wise samples: one row per episode, loss only on the assistant's tokens (checked by decoding)."""

from __future__ import annotations

import torch

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env import FrozenLakeEnv
from roll.agentic.env_manager import TrajEnvManager
from roll.pipelines.algorithms import token_level_rewards_from_scores
from roll.strategies.ops import position_ids_from_attention_mask


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


SPEC = dict(env_type="frozen_lake", env_config={"size": 4, "format_penalty": -0.1}, max_steps=4)


def test_layout_masks_only_assistant_tokens(play, scripted, tokenizer, mask_runs) -> None:
    responses = ["<answer>Up</answer>", "no idea", "<answer>Left</answer>", "<answer>Down</answer>"]
    client = scripted(responses)
    (result,) = play(CustomEnvConfig(**SPEC), client, seed=11)
    batch = result.batch
    assert len(batch) == 1 and result.num_turns == len(client.requests)
    data = batch.batch
    prompt_width = data["prompts"].shape[1]
    assert torch.equal(data["input_ids"], torch.cat([data["prompts"], data["responses"]], dim=1))
    assert torch.equal(data["position_ids"], position_ids_from_attention_mask(data["attention_mask"]))
    response_attention = data["attention_mask"][0, prompt_width:]
    mask = data["response_mask"][0]
    assert bool((mask <= response_attention).all()) and bool(data["attention_mask"][0, :prompt_width].all())
    # Each run of the loss mask decodes to exactly one assistant response (with its EOS), in order.
    runs = mask_runs(mask.tolist())
    assert len(runs) == result.num_turns
    ids = data["responses"][0]
    for (start, end), response in zip(runs, responses):
        assert tokenizer.decode(ids[start:end]) == response + tokenizer.eos_token
    # Tokens between the runs are the environment's messages: never trained on, log-prob 0.
    between = tokenizer.decode(ids[runs[0][1] : runs[1][0]])
    assert between.startswith("\n<|im_start|>user\nTurn 2:") and between.endswith("<|im_start|>assistant\n")
    log_probs = data["rollout_log_probs"][0]
    assert bool((log_probs[mask.bool()] == -0.5).all()) and bool((log_probs[~mask.bool()] == 0).all())
    # The response ends with the last assistant token.
    assert int(response_attention.sum()) == runs[-1][1]


def test_decoded_row_is_the_chat_template_of_the_conversation(play, scripted, tokenizer) -> None:
    responses = ["<answer>Up</answer>", "<answer>Right</answer>"]
    client = scripted(responses)
    (result,) = play(CustomEnvConfig(**{**SPEC, "max_steps": 2}), client, seed=3)
    data = result.batch.batch
    row = data["input_ids"][0][data["attention_mask"][0].bool()]
    # The model input of the last request is the row minus the last response: nothing is re-tokenized.
    last = client.requests[-1].prompt_ids
    assert row[: len(last)].tolist() == last
    text = tokenizer.decode(row)
    env = FrozenLakeEnv(size=4, format_penalty=-0.1)
    obs, info = env.reset(seed=3)
    first_user = f"{info['env_instruction']}\nTurn 1:\nObservation:\n{obs}\n"
    assert first_user in text
    obs2, *_ = env.step(responses[0])
    assert f"Turn 2:\nObservation:\n{obs2}\nYou have 1 actions left." in text
    messages = [
        {"role": "system", "content": CustomEnvConfig(**SPEC).agent_system_template},
        {"role": "user", "content": text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]},
        {"role": "assistant", "content": responses[0]},
        {"role": "user", "content": text.split("<|im_start|>user\n")[2].split("<|im_end|>")[0]},
        {"role": "assistant", "content": responses[1]},
    ]
    assert text + "\n" == tokenizer.apply_chat_template(messages, tokenize=False)


def test_scores_and_step_scores(play, scripted, tokenizer) -> None:
    env = FrozenLakeEnv(size=4, format_penalty=-0.1)
    env.reset(seed=21)
    plan = env.solution()
    responses = ["bad"] + [f"<answer>{a}</answer>" for a in plan]
    client = scripted(responses)
    (result,) = play(CustomEnvConfig(**{**SPEC, "max_steps": 10}), client, seed=21)
    assert result.end_reason == "terminated" and result.success and result.num_turns == len(plan) + 1
    columns = result.batch.non_tensor_batch
    assert columns["step_scores"][0] == [-0.1] + [0.0] * (len(plan) - 1) + [1.0]
    assert abs(result.episode_score - 0.9) < 1e-6
    assert result.batch.batch["scores"].dtype == torch.float32 and abs(result.batch.batch["scores"][0] - 0.9) < 1e-6
    assert columns["success"].tolist() == [True] and columns["end_reason"].tolist() == ["terminated"]
    assert result.format_ratio == len(plan) / (len(plan) + 1) and result.metrics["format"] == result.format_ratio
    # The episode score lands on the last assistant token, which is the row's last token.
    data = result.batch.batch
    rewards = token_level_rewards_from_scores(data["scores"], data["response_mask"])
    last = int(data["response_mask"][0].nonzero().max())
    assert abs(rewards[0, last].item() - 0.9) < 1e-6 and rewards[0].abs().sum().item() == rewards[0, last].abs().item()
    response_attention = data["attention_mask"][0, data["prompts"].shape[1] :]
    assert last == int(response_attention.nonzero().max())


def test_tool_results_come_back_as_tool_messages(play, scripted, tokenizer) -> None:
    call = '<tool_call>{"name": "python_code", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    client = scripted(lambda prompt: call if "python_code result" not in prompt else "<answer>42</answer>")
    spec = CustomEnvConfig(env_type="tool_math", env_config={"digits": 1, "operators": "*"}, max_steps=3)
    (result,) = play(spec, client, seed=0)
    text = tokenizer.decode(result.batch.batch["responses"][0])
    assert "<|im_start|>tool\npython_code result:\n42" in text
    assert result.metrics["tool_use_counter"] == 1.0 and result.metrics["tool_success_counter"] == 1.0
    assert result.num_turns == 2


def test_gem_runner_layout_puts_the_env_instruction_in_the_system_message(play, scripted, tokenizer) -> None:
    """ROLL's ProxyEnvManager + GEMRunner: system = template + blank line + env instruction; users = observations."""
    from roll.agentic.config import ROLL_GEM_RUNNER, ROLL_PROXY_ENV_MANAGER
    from roll.agentic.env_manager.chat import render_template

    spec = CustomEnvConfig(
        **{**SPEC, "max_steps": 2}, env_manager_cls=ROLL_PROXY_ENV_MANAGER, agent_runner_cls=ROLL_GEM_RUNNER
    )
    assert (spec.env_manager_cls, spec.env_instruction_in_system) == ("traj", True)
    responses = ["<answer>Up</answer>", "<answer>Right</answer>"]
    (result,) = play(spec, scripted(responses), seed=3)
    data = result.batch.batch
    text = tokenizer.decode(data["input_ids"][0][data["attention_mask"][0].bool()])
    env = FrozenLakeEnv(size=4, format_penalty=-0.1)
    obs, info = env.reset(seed=3)
    obs2, reward1, *_ = env.step(responses[0])

    def user(observation: str, turn: int) -> str:  # GEMRunner's rendering of agent_template (suffix "")
        fields = dict(observation=observation, turn_idx=turn, actions_left=3 - turn, suffix="")
        return render_template(spec.agent_template or "", max_response_length=spec.max_tokens_per_step, **fields)

    messages = [
        {"role": "system", "content": f"{spec.agent_system_template}\n\n{info['env_instruction']}"},
        {"role": "user", "content": user(obs, 1)},
        {"role": "assistant", "content": responses[0]},
        {"role": "user", "content": user(obs2, 2)},
        {"role": "assistant", "content": responses[1]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text + "\n" == rendered, (text, rendered)
    *_, reward2 = env.step(responses[1])[:2]
    assert result.batch.non_tensor_batch["step_scores"][0] == [reward1, reward2]  # GEMRunner: score = their sum
    assert float(data["scores"][0].sum()) == reward1 + reward2


def test_show_env_instruction_false_opens_with_the_observation(play, scripted, tokenizer) -> None:
    responses = ["<answer>Up</answer>", "<answer>Right</answer>"]
    spec = CustomEnvConfig(
        **{**SPEC, "max_steps": 2},
        agent_system_template=None,
        agent_template="{observation}",
        show_env_instruction=False,
    )
    (result,) = play(spec, scripted(responses), seed=3)
    data = result.batch.batch
    text = tokenizer.decode(data["input_ids"][0][data["attention_mask"][0].bool()])
    env = FrozenLakeEnv(size=4, format_penalty=-0.1)
    obs, info = env.reset(seed=3)
    obs2, *_ = env.step(responses[0])
    messages = [
        {"role": "user", "content": obs},
        {"role": "assistant", "content": responses[0]},
        {"role": "user", "content": obs2},
        {"role": "assistant", "content": responses[1]},
    ]
    assert text + "\n" == tokenizer.apply_chat_template(messages, tokenize=False)
    assert info["env_instruction"].splitlines()[0] not in text


# A template that, like Qwen3's, writes an empty think block into the last assistant message only: the anchor
# conversation renders differently alone and with messages after it, but what it appends does not change.
THINK_LAST = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_turns_append_what_the_template_appends_when_it_rewrites_earlier_messages() -> None:
    """The formatter compares only what follows the anchor assistant's turn: a Qwen3-like template (think block on
    the last assistant message only) used to fail every second turn with 'renders earlier messages differently'."""
    from roll.agentic.env_manager.chat import ChatFormatter
    from roll.strategies.testing import default_corpus, make_tokenizer

    tokenizer = make_tokenizer(default_corpus(0, 50), 300)
    tokenizer.chat_template = THINK_LAST
    formatter = ChatFormatter(tokenizer)
    answered = [*formatter.first_turn([{"role": "user", "content": "hi"}]), tokenizer.eos_token_id]
    after_stop = formatter.next_turn([{"role": "user", "content": "obs"}], answered)
    assert tokenizer.decode(after_stop) == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    cut = formatter.next_turn([{"role": "tool", "content": "42"}], answered[:-1])  # no EOS: the turn is closed
    assert tokenizer.decode(cut) == "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def test_a_reply_that_stopped_on_the_templates_end_of_turn_token_gets_it_once(tokenizer) -> None:
    """A tokenizer whose EOS is not the template's end-of-turn token (Gemma's <eos> and <end_of_turn>, a base Qwen's
    <|endoftext|> and <|im_end|>): a reply that stopped on <|im_end|> got a second <|im_end|> after it."""
    import copy

    from roll.agentic.env_manager.chat import ChatFormatter

    base = copy.deepcopy(tokenizer)
    base.eos_token = "<|endoftext|>"
    formatter = ChatFormatter(base)
    reply = _ids(base, "<answer>Up</answer>")
    end_of_turn = base.convert_tokens_to_ids("<|im_end|>")
    nxt = [{"role": "user", "content": "obs"}]
    after_turn_end = formatter.next_turn(nxt, [*reply, end_of_turn])
    assert (
        base.decode(after_turn_end, skip_special_tokens=False)
        == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    )
    cut = formatter.next_turn(nxt, reply)  # no end token at all: the template's whole end of turn
    assert base.decode(cut, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>user")
    after_eos = formatter.next_turn(nxt, [*reply, base.eos_token_id])  # EOS is not the turn's end: it follows
    assert base.decode(after_eos, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>user")


def test_messages_are_kept_only_for_a_client_that_sends_them(play, scripted, kept_messages) -> None:
    responses = ["<answer>Up</answer>", "no idea", "<answer>Left</answer>"]
    spec = CustomEnvConfig(**{**SPEC, "max_steps": 3})
    sizes = kept_messages(TrajEnvManager)
    chat = scripted(responses, wants_messages=True)
    (with_messages,) = play(spec, chat, seed=11)
    chat_sizes, sizes[:] = list(sizes), []
    tokens = scripted(responses)
    (without,) = play(spec, tokens, seed=11)
    # a chat proxy gets the whole conversation: system + user, then an assistant answer and a user turn per turn
    assert chat_sizes == [2, 4, 6]
    assert [len(r.messages) for r in chat.requests] == [2, 4, 6]
    assert chat.requests[1].messages[2] == {"role": "assistant", "content": responses[0]}
    # any other client: nothing is kept, nothing is sent
    assert sizes == [0, 0, 0] and all(r.messages is None for r in tokens.requests)
    # and the samples are the same, tensor for tensor and column for column
    assert with_messages.batch.batch.keys() == without.batch.batch.keys()
    for key in with_messages.batch.batch.keys():
        assert torch.equal(with_messages.batch.batch[key], without.batch.batch[key]), key
    assert [r.prompt_ids for r in chat.requests] == [r.prompt_ids for r in tokens.requests]
    for key, column in with_messages.batch.non_tensor_batch.items():
        assert column.tolist() == without.batch.non_tensor_batch[key].tolist(), key
