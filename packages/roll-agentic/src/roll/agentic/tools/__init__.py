"""Tools for agentic environments: a registry, the tool-call formats (Hermes/Qwen ``<tool_call>``, GEM's
tags), and built-in tools."""

from __future__ import annotations

from roll.agentic.tools.base import Tool, ToolResult, ToolSpec, describe_tools
from roll.agentic.tools.formats import TOOL_FORMATS, ActionFormat, action_format
from roll.agentic.tools.parsing import ParsedToolCalls, ToolCall, format_tool_call, parse_tool_calls
from roll.agentic.tools.registry import TOOLS, check_tool, make_tool, register_tool
from roll.agentic.tools.wrapper import ToolEnvWrapper, tool_wrapper

__all__ = [
    "TOOLS",
    "TOOL_FORMATS",
    "ActionFormat",
    "ParsedToolCalls",
    "Tool",
    "ToolCall",
    "ToolEnvWrapper",
    "ToolResult",
    "ToolSpec",
    "action_format",
    "check_tool",
    "describe_tools",
    "format_tool_call",
    "make_tool",
    "parse_tool_calls",
    "register_tool",
    "tool_wrapper",
]
