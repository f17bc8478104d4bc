"""Token ids of a multi-turn chat, built one turn at a time with the tokenizer's chat template.

A trajectory's tokens are the model's own sampled tokens plus, between its turns, the template's text for the
next messages. :class:`ChatFormatter` renders only the *new* messages: it renders an anchor conversation followed by
them and keeps what comes after the anchor assistant's turn, so the sampled assistant tokens are never re-tokenized
(re-tokenizing can change ids and would break the log-probs recorded at sampling time). What the template puts after
an assistant message (e.g. ``<|im_end|>\\n``) is added as a bridge, minus the EOS token the model already produced (or
the template's end-of-turn token, where that is not the EOS, when the model stopped on it).

Only the text after the anchor assistant's content is compared, not the whole rendering: templates may render
earlier messages differently once more follow (Qwen3 writes an empty think block into the last assistant message
only) or stamp the date into the system header (Llama 3.x), and neither changes what is appended.

A template that refuses the system role (Gemma 2's, Mistral's first ones raise an error for it) gets the system
message's text in front of the first user message's, as Gemma 3's template does itself
(:func:`roll.pipelines.data.templates.for_template`, applied by ``render_chat``).

``enable_thinking`` (the env tag's, ROLL's name; ROLL renders agentic prompts with it false) goes to
``apply_chat_template`` only when it is set and the template reads it: a Qwen3-style template then ends the
generation prompt with an empty think block (false) or lets the model open one (true); any other template renders
exactly as without it.
"""

from __future__ import annotations

from typing import Any

from roll.pipelines.data.templates import render_chat
from roll.runtime import ConfigError

__all__ = ["ChatFormatter", "render_template", "turn_end_token_id"]

Message = dict[str, str]
_ANCHOR_REPLY = "roll-anchor-assistant"
_ANCHOR: list[Message] = [
    {"role": "system", "content": "roll-anchor-system"},
    {"role": "user", "content": "roll-anchor-user"},
    {"role": "assistant", "content": _ANCHOR_REPLY},
]


def render_template(template: str, **values: Any) -> str:
    """``template.format(...)`` with only the fields it names (the templates are checked when configs load)."""
    from roll.agentic.config import template_fields

    return template.format(**{name: values[name] for name in template_fields(template) if name in values})


def turn_end_token_id(tokenizer: Any) -> int:
    """The token an answer that stopped ends its turn with under ``tokenizer``'s chat template: the template's
    end-of-turn token where it is not the EOS (Gemma's ``<end_of_turn>`` beside ``<eos>``, a base Qwen's
    ``<|im_end|>`` beside ``<|endoftext|>``), else the EOS (also for a tokenizer without a chat template)."""
    try:
        return ChatFormatter(tokenizer).turn_end_id
    except Exception:  # a template that cannot lay out turns: the EOS
        return int(tokenizer.eos_token_id)


class ChatFormatter:
    """Renders chat messages to token ids with ``tokenizer``'s chat template, incrementally; ``enable_thinking``
    (None: the template's own default) is passed to a template that reads it."""

    def __init__(self, tokenizer: Any, enable_thinking: bool | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("the tokenizer has no chat_template; agentic rollouts need a chat model's tokenizer")
        self.tokenizer, self.enable_thinking = tokenizer, enable_thinking
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ConfigError("the tokenizer has no eos_token_id")
        self.eos_token_id = int(eos)
        self.eos_text = tokenizer.convert_ids_to_tokens(self.eos_token_id)
        anchor = self._render(_ANCHOR, generation_prompt=False)
        if _ANCHOR_REPLY not in anchor:
            raise ConfigError("the chat template drops assistant content; it cannot render multi-turn conversations")
        suffix = anchor[anchor.rindex(_ANCHOR_REPLY) + len(_ANCHOR_REPLY) :]
        # After the model's own EOS only the rest of the template's suffix is missing (e.g. "\n" after <|im_end|>).
        after_eos = suffix[len(self.eos_text) :] if suffix.startswith(self.eos_text) else suffix
        self.bridge_after_stop = self.encode(after_eos)
        self.bridge_after_cut = self.encode(suffix)
        self._bridges = {self.eos_token_id: self.bridge_after_stop}
        # The template's end-of-turn token when it is not the tokenizer's EOS (Gemma's <end_of_turn> beside <eos>, a
        # base Qwen's <|im_end|> beside <|endoftext|>): a reply that stopped on it has ended its turn too, and only
        # the rest of the suffix follows (it was written a second time, as after a cut reply).
        head = self.bridge_after_cut[:1]
        head_text = tokenizer.convert_ids_to_tokens(head[0]) if head else ""
        self.turn_end_id = self.eos_token_id
        """The token that ends an assistant turn: the template's end-of-turn token where it is not the EOS."""
        if head and head[0] != self.eos_token_id and suffix.startswith(head_text) and not self.decode(head):
            self._bridges[head[0]] = self.encode(suffix[len(head_text) :])
            self.turn_end_id = head[0]
        self._suffix = suffix
        self._appended([{"role": "user", "content": "roll-anchor-next"}])  # a template that cannot work fails here

    def _render(self, messages: list[Message], generation_prompt: bool) -> str:
        return render_chat(
            self.tokenizer, messages, add_generation_prompt=generation_prompt, enable_thinking=self.enable_thinking
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def first_turn(self, messages: list[Message]) -> list[int]:
        """Ids of a conversation's opening messages, ending with the assistant generation prompt."""
        return self.encode(self._render(messages, generation_prompt=True))

    def next_turn(self, messages: list[Message], previous_response: list[int]) -> list[int]:
        """Ids that follow the previous assistant response: the end of its turn, ``messages``, generation prompt."""
        last = previous_response[-1] if previous_response else None
        bridge = self._bridges.get(last, self.bridge_after_cut) if last is not None else self.bridge_after_cut
        return bridge + self.encode(self._appended(messages))

    def _appended(self, messages: list[Message]) -> str:
        """The text the template adds for ``messages`` after a finished assistant turn, generation prompt included."""
        full = self._render([*_ANCHOR, *messages], generation_prompt=True)
        start = full.find(_ANCHOR_REPLY)
        end = start + len(_ANCHOR_REPLY)
        if start < 0 or not full.startswith(self._suffix, end):
            raise ConfigError(
                "the chat template ends an assistant turn differently once more messages follow; multi-turn token "
                "layouts need the same end-of-turn text wherever the turn is"
            )
        return full[end + len(self._suffix) :]
