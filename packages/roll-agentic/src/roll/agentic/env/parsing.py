"""Reading the model's action out of its response, with ROLL's patterns.

``action_pattern`` (``<answer>...</answer>``) has one group, the action; ``think_action_pattern`` has two, the
reasoning and the action. Chat special tokens are removed first, so a response that ends with ``<|im_end|>``
parses the same as one without it.

Standard library only (roll's ConfigError where roll is installed): the ``sokoban_sandbox`` env's game server
runs a copy of this file inside its sandbox (:mod:`roll.agentic.env.sokoban_sandbox.app`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

try:
    from roll.runtime import ConfigError
except ImportError:  # a copy of this file in sokoban_sandbox's app, run where roll is not installed
    ConfigError = ValueError  # type: ignore[misc,assignment]  # roll's ConfigError is a ValueError

__all__ = [
    "ACTION_PATTERN",
    "ALL_RESPONSE_PATTERN",
    "DEFAULT_SPECIAL_TOKENS",
    "THINK_ACTION_PATTERN",
    "ParsedAction",
    "parse_action",
]

ACTION_PATTERN = r"<answer>(.*?)</answer>"
THINK_ACTION_PATTERN = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"
ALL_RESPONSE_PATTERN = r"^(.*)$"
DEFAULT_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class ParsedAction:
    """The outcome of :func:`parse_action`."""

    action: str | None
    """The action: the matching choice in its canonical spelling, the raw content without choices, or ``None``."""
    content: str
    """The text inside the answer group (stripped), ``""`` if the pattern did not match."""
    think: str
    """The reasoning group of a think+answer pattern, else ``""``."""

    @property
    def valid(self) -> bool:
        return self.action is not None


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as e:
        raise ConfigError(f"action_pattern {pattern!r} is not a valid regular expression: {e}") from None
    if compiled.groups not in (1, 2):
        raise ConfigError(
            f"action_pattern {pattern!r} has {compiled.groups} groups; it needs 1 (the action) or 2 (think, action)"
        )
    return compiled


def parse_action(
    text: str,
    pattern: str = ACTION_PATTERN,
    choices: Iterable[str] | None = None,
    special_tokens: Iterable[str] = DEFAULT_SPECIAL_TOKENS,
) -> ParsedAction:
    """Find the first match of ``pattern`` in ``text``.

    With ``choices`` the action must equal one of them, case-insensitively (``"right"`` -> ``"Right"``);
    anything else is invalid. Without choices any non-empty content is the action.
    """
    compiled = _compile(pattern)
    for token in special_tokens:
        text = text.replace(token, "")
    match = compiled.search(text.strip())
    if match is None:
        return ParsedAction(None, "", "")
    if compiled.groups == 1:
        think, content = "", (match.group(1) or "").strip()
    else:
        think, content = (match.group(1) or "").strip(), (match.group(2) or "").strip()
    if choices is None:
        return ParsedAction(content or None, content, think)
    canonical = {choice.lower(): choice for choice in choices}
    return ParsedAction(canonical.get(content.lower()), content, think)
