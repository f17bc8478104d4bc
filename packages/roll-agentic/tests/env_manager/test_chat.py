"""``enable_thinking`` when agentic prompts are rendered: passed to a chat template that reads it (per env tag,
false unless set, as ROLL renders them), and never to one that does not (which renders exactly as before)."""

from __future__ import annotations

import copy

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env_manager import render_messages
from roll.agentic.env_manager.chat import ChatFormatter
from roll.pipelines.data.templates import fold_system, takes_system

# Qwen3-style: thinking unless told not to; enable_thinking false closes an empty think block in the generation
# prompt, so the model answers at once.
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"
OPENING = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Turn 1"}]


@pytest.fixture
def tokenizer(tokenizer):
    """The suite's tokenizer with a chat template that reads enable_thinking."""
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING
    return thinking


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_the_generation_prompt_under_true_false_and_unset(tokenizer) -> None:
    opening = "<|im_start|>system\nPlay.<|im_end|>\n<|im_start|>user\nTurn 1<|im_end|>\n<|im_start|>assistant\n"
    assert ChatFormatter(tokenizer, enable_thinking=False).first_turn(OPENING) == _ids(tokenizer, opening + EMPTY_THINK)
    # unset: the template's default (thinking), the same as true, and what the formatter rendered before the setting
    assert ChatFormatter(tokenizer).first_turn(OPENING) == _ids(tokenizer, opening)
    assert ChatFormatter(tokenizer, enable_thinking=True).first_turn(OPENING) == _ids(tokenizer, opening)
    assert ChatFormatter(tokenizer).first_turn(OPENING) == _ids(
        tokenizer, tokenizer.apply_chat_template(OPENING, tokenize=False, add_generation_prompt=True)
    )


def test_later_turns_end_with_the_same_generation_prompt(tokenizer) -> None:
    formatter = ChatFormatter(tokenizer, enable_thinking=False)
    answered = [*formatter.first_turn(OPENING), *_ids(tokenizer, "<answer>Up</answer>"), tokenizer.eos_token_id]
    turn = formatter.next_turn([{"role": "user", "content": "Turn 2"}], answered)
    assert tokenizer.decode(turn) == f"\n<|im_start|>user\nTurn 2<|im_end|>\n<|im_start|>assistant\n{EMPTY_THINK}"
    thinking = ChatFormatter(tokenizer, enable_thinking=True).next_turn(
        [{"role": "user", "content": "Turn 2"}], answered
    )
    assert tokenizer.decode(thinking) == "\n<|im_start|>user\nTurn 2<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_without_enable_thinking_renders_byte_for_byte_as_before(tokenizer) -> None:
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = CHATML
    before = plain.apply_chat_template(OPENING, tokenize=False, add_generation_prompt=True)
    for value in (None, True, False):
        formatter = ChatFormatter(plain, enable_thinking=value)
        assert formatter.first_turn(OPENING) == _ids(plain, before)
        assert render_messages(plain, OPENING, [], False, value) == _ids(plain, before)


def test_agent_native_prompts_take_the_tags_setting(tokenizer) -> None:
    base = tokenizer.apply_chat_template(OPENING, tokenize=False, add_generation_prompt=True)
    assert render_messages(tokenizer, OPENING, [], False) == _ids(tokenizer, base + EMPTY_THINK)  # ROLL's default
    assert render_messages(tokenizer, OPENING, [], False, None) == _ids(tokenizer, base)
    assert render_messages(tokenizer, OPENING, [], False, True) == _ids(tokenizer, base)


@pytest.mark.parametrize(
    ("setting", "think"), [({}, True), ({"enable_thinking": True}, False), ({"enable_thinking": None}, False)]
)
def test_each_env_tag_renders_with_its_own_setting(play, scripted, tokenizer, setting, think) -> None:
    spec = CustomEnvConfig(env_type="frozen_lake", env_config={"size": 3}, max_steps=2, **setting)
    client = scripted(["<answer>Up</answer>", "<answer>Left</answer>"])
    (result,) = play(spec, client, seed=1)
    for request in client.requests:
        assert tokenizer.decode(request.prompt_ids).endswith("<|im_start|>assistant\n" + (EMPTY_THINK if think else ""))
    # the trajectory's row holds each turn's generation prompt as it was sampled from
    row = tokenizer.decode(result.batch.batch["input_ids"][0])
    assert row.count(EMPTY_THINK) == (result.num_turns if think else 0)


def test_the_setting_is_rolls_default_false() -> None:
    assert CustomEnvConfig(env_type="frozen_lake").enable_thinking is False
    with pytest.raises(ValueError, match="enable_thinking"):
        CustomEnvConfig(env_type="frozen_lake", enable_thinking="sometimes")


# Gemma 2's (and Mistral's first templates') way: the system role is refused with raise_exception.
NO_SYSTEM = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" + CHATML
)


def test_a_template_that_refuses_the_system_role_gets_it_in_front_of_the_first_user_message(tokenizer) -> None:
    """ChatFormatter rendered an anchor with a system message: a template refusing the system role (Gemma 2's) failed
    every agentic run at its first prompt. Its text now goes in front of the first user message's, as Gemma 3's
    template does itself; a template that takes system messages renders them as before."""
    refusing = copy.deepcopy(tokenizer)
    refusing.chat_template = NO_SYSTEM
    formatter = ChatFormatter(refusing)
    assert not takes_system(refusing) and takes_system(tokenizer)
    first = formatter.first_turn(OPENING)
    assert refusing.decode(first) == "<|im_start|>user\nPlay.\n\nTurn 1<|im_end|>\n<|im_start|>assistant\n"
    answered = [*first, *_ids(refusing, "<answer>Up</answer>"), refusing.eos_token_id]
    turn = formatter.next_turn([{"role": "user", "content": "Turn 2"}], answered)
    assert refusing.decode(turn) == "\n<|im_start|>user\nTurn 2<|im_end|>\n<|im_start|>assistant\n"
    # agent-native prompts (an env's own message list) render the same way
    assert render_messages(refusing, OPENING, [], False, None) == first


def test_fold_system() -> None:
    assert fold_system(OPENING) == [{"role": "user", "content": "Play.\n\nTurn 1"}]
    assert fold_system([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]
    assert fold_system(OPENING[1:]) == OPENING[1:]
