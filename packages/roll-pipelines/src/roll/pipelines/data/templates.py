"""Turn rows into text pieces, each marked as a training target or not, with or without a chat template.

Working on text pieces (tokenized one by one) instead of token offsets keeps the prompt/target boundary exact
for any tokenizer. With ChatML-style templates every boundary falls on a special token, so the token sequence is
the same as tokenizing the whole conversation at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roll.pipelines.data.args import DataArgs
from roll.pipelines.data.errors import DataError
from roll.runtime.errors import ConfigError

__all__ = [
    "Piece",
    "chat_pieces",
    "fold_system",
    "for_template",
    "has_chat_template",
    "pieces_to_ids",
    "render_chat",
    "takes_system",
    "thinking_kwargs",
    "tokenize_text",
    "uses_chat_template",
    "with_system",
]

Piece = tuple[str, bool]  # (text, is_target)
Message = dict[str, Any]


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def thinking_kwargs(tokenizer: Any, enable_thinking: bool | None) -> dict[str, bool]:
    """``{"enable_thinking": enable_thinking}`` for ``apply_chat_template`` when it is set and the tokenizer's chat
    template reads it (Qwen3-style templates think unless told not to), else ``{}``: a template that does not read
    it, or an unset value, renders exactly as without the setting."""
    if enable_thinking is None:
        return {}
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template]
    reads = any(isinstance(text, str) and "enable_thinking" in text for text in texts)
    return {"enable_thinking": enable_thinking} if reads else {}


def uses_chat_template(tokenizer: Any, args: DataArgs) -> bool:
    """Whether rows are formatted with the chat template: asked for, and the tokenizer has one.

    Chat rows (``messages_key``) cannot be formatted without a template, so they raise ``ConfigError`` instead.
    """
    if args.apply_chat_template and has_chat_template(tokenizer):
        return True
    if args.messages_key is not None:
        reason = "apply_chat_template is false" if not args.apply_chat_template else "the tokenizer has no template"
        raise ConfigError(
            f"data_args.messages_key={args.messages_key!r} needs a chat template but {reason}; use a tokenizer with "
            f"a chat template and apply_chat_template: true, or switch to prompt/response columns"
        )
    return False


def with_system(messages: Sequence[Message], system_prompt: str | None) -> list[Message]:
    """``messages`` with ``system_prompt`` prepended, unless absent or the conversation has its own."""
    messages = [dict(m) for m in messages]
    if system_prompt is None or (messages and messages[0].get("role") == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def fold_system(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` without a leading system message: its text goes in front of the first user message's, as Gemma
    3's template does itself (or the message becomes a user one, when no user message follows it)."""
    chat = [dict(m) for m in messages]
    if not chat or chat[0].get("role") != "system":
        return chat
    system, rest = chat[0], chat[1:]
    if rest and rest[0].get("role") == "user":
        return [{**rest[0], "content": f"{system['content']}\n\n{rest[0]['content']}"}, *rest[1:]]
    return [{**system, "role": "user"}, *rest]


_TAKES_SYSTEM: dict[str, bool] = {}


def takes_system(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders a system message (Gemma 2's and Mistral's first templates raise
    an error for one); probed once per template."""
    template = str(getattr(tokenizer, "chat_template", None))
    if template not in _TAKES_SYSTEM:
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        try:
            tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
            _TAKES_SYSTEM[template] = True
        except Exception:  # jinja's raise_exception in the template (TemplateError)
            _TAKES_SYSTEM[template] = False
    return _TAKES_SYSTEM[template]


def for_template(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``messages`` as ``tokenizer``'s chat template takes them: a leading system message folded into the first user
    message (:func:`fold_system`) where the template refuses the system role; otherwise the same messages."""
    if messages and messages[0].get("role") == "system" and not takes_system(tokenizer):
        return list(fold_system(messages))
    return list(messages)


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = False,
    enable_thinking: bool | None = None,
) -> str:
    """The chat template applied to ``messages`` as text ("" for no messages); ``enable_thinking`` as in
    :func:`thinking_kwargs`; a system message as the template takes it (:func:`for_template`)."""
    if not messages:
        return ""
    return tokenizer.apply_chat_template(
        for_template(tokenizer, messages),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **thinking_kwargs(tokenizer, enable_thinking),
    )


def _suffix(longer: str, prefix: str, where: str, turn: int) -> str:
    if not longer.startswith(prefix):
        raise DataError(
            f"{where}: the chat template renders turn {turn} by changing earlier text, so the trained tokens "
            f"cannot be located; use a prefix-stable template (e.g. ChatML) or prompt/response columns"
        )
    return longer[len(prefix) :]


def _split_after_eos(text: str, eos: str | None) -> tuple[str, str]:
    """Split an assistant turn after its last end-of-sequence marker: (target, trailing non-target)."""
    if not eos:
        return text, ""
    end = text.rfind(eos)
    if end < 0:
        return text, ""
    end += len(eos)
    return text[:end], text[end:]


def chat_pieces(
    tokenizer: Any, messages: Sequence[Message], *, where: str = "row", enable_thinking: bool | None = None
) -> list[Piece]:
    """Pieces of a conversation where exactly the assistant turns are targets.

    An assistant turn's target is what the template adds after the generation prompt, up to and including
    the end-of-sequence text (so the model learns to stop); the generation prompt and any text after the
    end-of-sequence marker (e.g. a newline) are not targets.
    """
    pieces: list[Piece] = []
    rendered = ""
    chat = for_template(tokenizer, messages)  # folded once, so every prefix renders the same opening
    for k, message in enumerate(chat):
        full = render_chat(tokenizer, chat[: k + 1], enable_thinking=enable_thinking)
        if message["role"] != "assistant":
            pieces.append((_suffix(full, rendered, where, k), False))
        elif k == 0:
            raise DataError(f"{where}: the conversation starts with an assistant turn; it needs a prompt before it")
        else:
            prefix = render_chat(tokenizer, chat[:k], add_generation_prompt=True, enable_thinking=enable_thinking)
            pieces.append((_suffix(prefix, rendered, where, k), False))
            target, rest = _split_after_eos(_suffix(full, prefix, where, k), tokenizer.eos_token)
            pieces.extend([(target, True), (rest, False)])
        rendered = full
    return [(text, is_target) for text, is_target in pieces if text]


def tokenize_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (templates and pieces already carry them)."""
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def pieces_to_ids(tokenizer: Any, pieces: Sequence[Piece]) -> tuple[list[int], list[bool]]:
    """Tokenize each piece and concatenate: (input_ids, is_target per token)."""
    ids: list[int] = []
    targets: list[bool] = []
    for text, is_target in pieces:
        piece_ids = tokenize_text(tokenizer, text)
        ids.extend(piece_ids)
        targets.extend([is_target] * len(piece_ids))
    return ids, targets
