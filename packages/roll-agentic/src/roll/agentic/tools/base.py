"""The tool contract: a tool offers one or more named functions with JSON-schema parameters.

Tools are called synchronously from an environment's ``step`` (which the env managers run off the event loop);
a tool that talks to a server keeps its own connection (see :class:`~roll.agentic.tools.mcp.MCPTool`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Tool", "ToolResult", "ToolSpec", "describe_tools"]


@dataclass(frozen=True)
class ToolSpec:
    """One callable function of a tool, as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_json(self) -> dict[str, Any]:
        """The OpenAI/Qwen function schema (what chat templates put in their tools section)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolResult:
    """What a call returned: ``ok`` is False when the tool failed (bad arguments, error, timeout)."""

    ok: bool
    output: str


class Tool(ABC):
    """Base class of tools. Subclasses list their functions in :meth:`specs` and run them in :meth:`call`.

    ``tool_instruction`` (set from the ``tool_instruction`` tool arg, as in ROLL): the text that introduces this tool
    to the model in place of the generated description of its functions; ``""`` introduces it with nothing.

    ``gem_form``: how the model calls this tool under ``tool_format: gem`` (see :mod:`roll.agentic.tools.formats`):
    ``"python"`` (a ``<python>`` block, passed as the ``code`` argument of the tool's first function), ``"search"``
    (``<search>``, passed as ``query``) or ``"function"`` (a named call with JSON arguments; the default).
    ``action_format``: the wrapper's ``tool_format``, set by the wrapper, for a tool that words its results for it.
    """

    tool_instruction: str | None = None
    gem_form: str = "function"
    action_format: str = "hermes"

    @abstractmethod
    def specs(self) -> list[ToolSpec]:
        """The functions this tool offers."""

    @abstractmethod
    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run function ``name``; must not raise for anything the model did wrong (return ``ok=False``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (servers, indexes)."""


def describe_tools(specs: list[ToolSpec]) -> str:
    """The instruction that tells the model which tools exist and how to call them (Hermes/Qwen format); empty for
    no tools."""
    if not specs:
        return ""
    lines = [
        "You may call tools. To call one, write exactly:",
        '<tool_call>{"name": <tool name>, "arguments": <JSON object of arguments>}</tool_call>',
        "The result comes back in the next message. Available tools:",
    ]
    lines += [json.dumps(spec.as_json(), ensure_ascii=False) for spec in specs]
    return "\n".join(lines)
