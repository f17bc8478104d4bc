"""Tool calls in the Hermes/Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

A response may hold several calls. A call whose JSON does not parse, or lacks a name, is reported as an error
(the model gets told, and the wrapper counts it as a failed call) rather than ignored. An unclosed final
``<tool_call>`` (generation stopped at the token limit) is parsed up to the end of the text, one followed by another
``<tool_call>`` before its ``</tool_call>`` up to that one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.env.tool_calls import TOOL_CALL_BLOCK, call_arguments

__all__ = ["ParsedToolCalls", "ToolCall", "format_tool_call", "parse_tool_calls"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedToolCalls:
    blocks: list[ToolCall | str] = field(default_factory=list)
    """Every ``<tool_call>`` block in the order written: its call, or (a block that could not be read) a message."""

    @property
    def calls(self) -> list[ToolCall]:
        return [block for block in self.blocks if isinstance(block, ToolCall)]

    @property
    def errors(self) -> list[str]:
        return [block for block in self.blocks if isinstance(block, str)]

    @property
    def present(self) -> bool:
        """The response tried to call a tool (well-formed or not)."""
        return bool(self.blocks)


def _parse_block(body: str) -> ToolCall | str:
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at position {e.pos})"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return 'the tool call must be a JSON object with a "name" string'
    arguments = call_arguments(payload)  # Llama 3's "parameters" too; a JSON string decoded
    if isinstance(arguments, str):
        return f'the "arguments" of tool {payload["name"]!r} are not a JSON object'
    if not isinstance(arguments, dict):
        return f'the "arguments" of tool {payload["name"]!r} must be a JSON object'
    return ToolCall(payload["name"], arguments)


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Every ``<tool_call>`` block of ``text``, in order."""
    if _OPEN not in text:
        return ParsedToolCalls()
    return ParsedToolCalls([_parse_block(match.group(1)) for match in TOOL_CALL_BLOCK.finditer(text)])


def format_tool_call(name: str, arguments: Any) -> str:
    """The text of one call, as a model should write it (``arguments`` a JSON object; a chat endpoint's unparsable
    string is written as given, and reads back as a failed call)."""
    return f"{_OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{_CLOSE}"
