"""``data_args.enable_thinking``: passed to a chat template that reads it (RLVR prompts, SFT and preference pairs),
never to one that does not, which renders exactly as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from roll.pipelines.data import DataArgs, encode_preference, encode_prompt, encode_sft
from roll.pipelines.data.templates import render_chat, thinking_kwargs

# Qwen3-style: thinking unless told not to; false closes an empty think block in the generation prompt and in the
# last assistant turn, so the model answers at once.
THINKING = (
    "{% set closed = enable_thinking is defined and enable_thinking is false %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and closed %}<think>\n\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if closed %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"
PROMPT = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
ROW = {"prompt": "What is 12 + 7?", "response": "19", "chosen": "19", "rejected": "20", "tag": "math"}


@pytest.fixture(scope="module")
def thinking(tokenizer) -> Any:
    out = copy.deepcopy(tokenizer)
    out.chat_template = THINKING
    return out


def args(**overrides: Any) -> DataArgs:
    return DataArgs(file_name="train.jsonl", **overrides)


def test_thinking_kwargs_only_for_a_set_value_and_a_template_that_reads_it(tokenizer, thinking) -> None:
    assert thinking_kwargs(thinking, False) == {"enable_thinking": False}
    assert thinking_kwargs(thinking, True) == {"enable_thinking": True}
    assert thinking_kwargs(thinking, None) == {}
    assert thinking_kwargs(tokenizer, False) == {}  # the tiny model's ChatML does not read it


def test_rl_prompts_under_true_false_and_unset(thinking) -> None:
    def prompt(**overrides: Any) -> str:
        return thinking.decode(encode_prompt(ROW, thinking, args(**overrides))["prompt_ids"])

    assert prompt(enable_thinking=False) == PROMPT + EMPTY_THINK
    assert prompt(enable_thinking=True) == PROMPT
    assert prompt() == PROMPT  # unset: the template's default, as before the setting
    assert DataArgs(file_name="x.jsonl").enable_thinking is None


def test_sft_and_preference_targets_follow_the_prompt(thinking) -> None:
    sft = encode_sft(ROW, thinking, args(enable_thinking=False))
    assert thinking.decode(sft["input_ids"]) == PROMPT + EMPTY_THINK + "19<|im_end|>"
    trained = [t for t, label in zip(sft["input_ids"], sft["labels"]) if label != -100]
    assert thinking.decode(trained) == "19<|im_end|>"  # the think block is prompt, not target
    pair = encode_preference(ROW, thinking, args(enable_thinking=False))
    assert thinking.decode(pair["prompt_ids"]) == PROMPT + EMPTY_THINK
    assert [thinking.decode(pair[k]) for k in ("chosen_ids", "rejected_ids")] == ["19<|im_end|>", "20<|im_end|>"]


def test_a_template_without_it_renders_byte_for_byte_as_before(tokenizer) -> None:
    messages = [{"role": "user", "content": ROW["prompt"]}]
    before = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for value in (None, True, False):
        assert render_chat(tokenizer, messages, add_generation_prompt=True, enable_thinking=value) == before
        encoded = encode_prompt(ROW, tokenizer, args(enable_thinking=value))
        assert encoded["prompt_ids"] == encode_prompt(ROW, tokenizer, args())["prompt_ids"]
        assert encode_sft(ROW, tokenizer, args(enable_thinking=value)) == encode_sft(ROW, tokenizer, args())


def test_a_template_that_refuses_the_system_role_gets_it_folded_into_the_first_user_message(tokenizer) -> None:
    """``data_args.system_prompt`` with a template that refuses the system role (Gemma 2's raise_exception): every
    row failed to encode. Its text now goes in front of the first user message's (as Gemma 3's template does), for
    RL prompts and SFT targets alike; a template that takes system messages renders them as before."""
    refusing = copy.deepcopy(tokenizer)
    refusing.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + tokenizer.chat_template
    )
    data = args(system_prompt="Be brief.")
    prompt = refusing.decode(encode_prompt(ROW, refusing, data)["prompt_ids"])
    assert prompt == "<|im_start|>user\nBe brief.\n\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    sft = encode_sft(ROW, refusing, data)
    assert refusing.decode([t for t, label in zip(sft["input_ids"], sft["labels"]) if label != -100]) == "19<|im_end|>"
    kept = tokenizer.decode(encode_prompt(ROW, tokenizer, data)["prompt_ids"])
    assert kept.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
