"""Action formats of the tool wrapper: how the model is told to call tools, how its calls are read, and how a result
comes back (``tool_wrapper.wrapper_args.tool_format``).

``hermes`` (roll's default): the Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` form for
every tool (:mod:`roll.agentic.tools.parsing`); every block of a response runs, in order, and each result comes
back as ``<name> result:`` / ``<name> failed:`` and its text.

``gem`` (the convention of GEM's tools, which ROLL's tool examples use): each tool has its own form, chosen by its
``gem_form`` (:class:`~roll.agentic.tools.Tool`):

- ``python`` (``python_code``): a ``<python>...</python>`` or ``<code>...</code>`` block (ROLL's tag) or a fenced
  python block; the result comes back after ``Code execution result:``.
- ``search``: ``<search>query</search>``; the passages come back inside ``<information>...</information>``.
- ``function`` (``mcp`` and any other tool): ``<tool_call><tool_name>NAME</tool_name><arguments>{JSON}</arguments>
  </tool_call>`` (GEM's MCP form; a JSON body ``{"tool_name", "tool_params"}`` as ROLL's MCP tool reads, or
  Hermes' ``{"name", "arguments"}``, is read too); the result comes back inside ``<tool_response>...
  </tool_response>``.

As in GEM, one call runs per turn: the tools are asked in config order and the first whose form the response holds
runs its first complete block (for ``python``, the block that ends first). Only complete blocks count: a response
cut off at the token limit inside a block is not a call (it goes to the env, which applies its format penalty). When
the call uses up ``max_tool_uses``, the observation ends with a notice to answer now.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from roll.agentic.tools.base import ToolResult, describe_tools
from roll.agentic.tools.parsing import ParsedToolCalls, ToolCall, format_tool_call, parse_tool_calls
from roll.runtime import ConfigError

if TYPE_CHECKING:
    from roll.agentic.tools.base import Tool

__all__ = ["TOOL_FORMATS", "ActionFormat", "GemFormat", "HermesFormat", "action_format"]

_PYTHON = [
    re.compile(p, re.DOTALL) for p in (r"<python>(.*?)</python>", r"<code>(.*?)</code>", r"```\n?python(.*?)```")
]
_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_FUNCTION = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)</tool_call>", re.DOTALL)  # complete: no <tool_call> inside
_XML_CALL = re.compile(r"\s*<tool_name>([^<]+)</tool_name>\s*<arguments>(.*?)</arguments>\s*", re.DOTALL)


class ActionFormat(ABC):
    """One way of calling tools: the instruction, the reader of a response and the wording of results."""

    name: str

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = tools

    def instruction(self) -> str:
        """The text appended to the first observation: each tool's ``tool_instruction`` or a generated one."""
        generated = self._describe([tool for tool in self.tools if tool.tool_instruction is None])
        own = [tool.tool_instruction for tool in self.tools if tool.tool_instruction]
        return "\n".join(part for part in [generated, *own] if part)

    @abstractmethod
    def _describe(self, tools: list[Tool]) -> str:
        """The generated instruction of ``tools`` (those without their own)."""

    @abstractmethod
    def parse(self, text: str) -> ParsedToolCalls:
        """The calls in a response, in the order they run (empty: the response is not a tool call)."""

    @abstractmethod
    def result(self, tool: Tool | None, call: ToolCall | str, result: ToolResult | None) -> str:
        """A call's observation; ``call`` a message (and ``result`` None) for a call that could not be read."""

    @abstractmethod
    def write(self, name: str, arguments: Any) -> str:
        """A structured call (a hosted chat model's ``tool_calls``) as the text :meth:`parse` reads back; ``arguments``
        the JSON object, or the endpoint's string where it is not one."""

    @abstractmethod
    def closing(self, cut_short: bool, budget_used_up: bool) -> str:
        """Appended to the observation: ``cut_short`` when calls were left unrun for the budget, ``budget_used_up``
        when the last call used up ``max_tool_uses``."""


class HermesFormat(ActionFormat):
    name = "hermes"

    def _describe(self, tools: list[Tool]) -> str:
        return describe_tools([spec for tool in tools for spec in tool.specs()])

    def parse(self, text: str) -> ParsedToolCalls:
        return parse_tool_calls(text)

    def result(self, tool: Tool | None, call: ToolCall | str, result: ToolResult | None) -> str:
        if isinstance(call, str) or result is None:
            return f"Tool call failed: {call}"
        return f"{call.name} result:\n{result.output}" if result.ok else f"{call.name} failed: {result.output}"

    def write(self, name: str, arguments: Any) -> str:
        return format_tool_call(name, arguments)

    def closing(self, cut_short: bool, budget_used_up: bool) -> str:
        return "\nTool budget used up: give your final answer." if cut_short else ""


def _first_python(text: str) -> re.Match[str] | None:
    matches = [m for m in (p.search(text) for p in _PYTHON) if m is not None]
    return min(matches, key=lambda m: m.end(), default=None)


def _function_call(body: str) -> ToolCall | str:
    xml = _XML_CALL.fullmatch(body)
    if xml is not None:
        name, raw = xml.group(1).strip(), xml.group(2).strip()
        try:
            arguments = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            return f"the <arguments> of tool {name!r} are not valid JSON ({e.msg} at position {e.pos})"
        if not isinstance(arguments, dict):
            return f"the <arguments> of tool {name!r} must be a JSON object"
        return ToolCall(name, arguments)
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("tool_name"), str):  # ROLL's MCP tool's JSON form
        params = payload.get("tool_params", {})
        if not isinstance(params, dict):
            return f'the "tool_params" of tool {payload["tool_name"]!r} must be a JSON object'
        return ToolCall(payload["tool_name"], params)
    blocks = parse_tool_calls(f"<tool_call>{body}</tool_call>").blocks  # Hermes' {"name", "arguments"}
    if isinstance(blocks[0], ToolCall):
        return blocks[0]
    return "write <tool_call><tool_name>NAME</tool_name><arguments>{JSON object}</arguments></tool_call>"


class GemFormat(ActionFormat):
    name = "gem"

    def __init__(self, tools: list[Tool]) -> None:
        super().__init__(tools)
        for tool in tools:
            if tool.gem_form not in ("python", "search", "function"):
                raise ConfigError(
                    f"tool {type(tool).__name__} has gem_form {tool.gem_form!r}; use 'python', 'search' or 'function'"
                )

    def _describe(self, tools: list[Tool]) -> str:
        texts = []
        for tool in tools:
            if tool.gem_form == "python":
                texts.append(
                    "Think step by step. You can run Python to help: write a complete program (imports included) "
                    "inside <python>...</python> tags or a ```python ... ``` block. It runs in a sandbox, and what it "
                    'prints comes back after "Code execution result: ". Print every value you want to see.'
                )
            elif tool.gem_form == "search":
                texts.append(
                    "You can look things up with a search engine. When you need knowledge you lack, write a query as "
                    "<search> your query </search>; the best passages come back inside <information> ... "
                    "</information>. Search as many times as you need, then give your final answer."
                )
            else:
                functions = "\n".join(json.dumps(spec.as_json(), ensure_ascii=False) for spec in tool.specs())
                texts.append(
                    "You can call the functions listed in <tools></tools> below, one call per message; the result "
                    "comes back inside <tool_response></tool_response> in the next message. Write a call as:\n"
                    '<tool_call>\n<tool_name>NAME</tool_name>\n<arguments>\n{"parameter": "value"}\n</arguments>\n'
                    f"</tool_call>\nwith the arguments as one valid JSON object.\n<tools>\n{functions}\n</tools>"
                )
        text = "\n".join(texts)
        return f"Available tools:\n{text}" if len(self.tools) > 1 and text else text

    def parse(self, text: str) -> ParsedToolCalls:
        for tool in self.tools:
            if tool.gem_form == "python":
                match = _first_python(text)
                if match is not None:
                    return ParsedToolCalls([ToolCall(tool.specs()[0].name, {"code": match.group(1).strip()})])
            elif tool.gem_form == "search":
                match = _SEARCH.search(text)
                if match is not None:
                    return ParsedToolCalls([ToolCall(tool.specs()[0].name, {"query": match.group(1).strip()})])
            else:
                match = _FUNCTION.search(text)
                if match is not None:
                    return ParsedToolCalls([_function_call(match.group(1))])
        return ParsedToolCalls()

    def write(self, name: str, arguments: Any) -> str:
        # python and search tools take their one argument inside their tag; a bare string is that argument
        forms = {tool.specs()[0].name: tool.gem_form for tool in self.tools if tool.gem_form != "function"}
        form, key = forms.get(name), {"python": "code", "search": "query"}.get(forms.get(name, ""), "")
        if form is not None:
            value = arguments.get(key, "") if isinstance(arguments, dict) else arguments
            return f"<{form}>{value}</{form}>"
        raw = json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else str(arguments)
        return f"<tool_call><tool_name>{name}</tool_name><arguments>{raw}</arguments></tool_call>"

    def result(self, tool: Tool | None, call: ToolCall | str, result: ToolResult | None) -> str:
        form = tool.gem_form if tool is not None else "function"
        text = f"Tool call failed: {call}" if result is None else result.output
        if form == "python":
            text = text.lstrip(" \n")
            return f"Code execution result: {text}\n"
        if form == "search":
            return f"\n\n<information>{text}</information>\n\n"
        return f"\n<tool_response>\n{text}\n</tool_response>\n"

    def closing(self, cut_short: bool, budget_used_up: bool) -> str:
        return "\n\nThat was your last tool call: give your final answer now." if budget_used_up else ""


TOOL_FORMATS: dict[str, type[ActionFormat]] = {"hermes": HermesFormat, "gem": GemFormat}


def action_format(name: str, tools: list[Tool]) -> ActionFormat:
    """The format ``name`` (``tool_wrapper.wrapper_args.tool_format``) for ``tools``."""
    cls = TOOL_FORMATS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"tool_wrapper.wrapper_args.tool_format {name!r}: use one of {sorted(TOOL_FORMATS)}")
    return cls(tools)
