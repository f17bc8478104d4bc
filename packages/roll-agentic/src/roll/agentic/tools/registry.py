"""Tools by id, resolved lazily: ``register_tool(id, "module:Class", **default_kwargs)``, ``make_tool(id, **kw)``.
A config's ``tool_id`` may also be a Tool class's import path (``"my_pkg.tools:MyTool"``): a name registered in the
driver is not known to the EnvironmentWorker processes, an import path is. A tool's module that fails while importing
(by path or registered) is one ``ModuleImportError`` naming the setting, the file and line, and the error.

Built in: ``python_code`` (roll's code sandbox), ``search`` (BM25 over a local document file, or a pluggable
backend) and ``mcp`` (the tools of an MCP server over stdio; needs ``roll-agentic[mcp]``). Third-party packages
add tools through the ``roll.agentic.tools`` entry-point group.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from roll.agentic.tools.base import Tool
from roll.runtime import ConfigError, Registry, import_target

__all__ = ["TOOLS", "check_tool", "make_tool", "register_tool"]

TOOLS: Registry[Any] = Registry("tool", entry_point_group="roll.agentic.tools")
_DEFAULT_KWARGS: dict[str, dict[str, Any]] = {}


def register_tool(
    tool_id: str, target: str | Any, *, package: str | None = None, extra: str | None = None, **kwargs: Any
) -> None:
    """Register a Tool class (or its ``"module:Class"`` path) as ``tool_id``; ``kwargs`` are default arguments."""
    TOOLS.register(tool_id, target, package=package, extra=extra)
    _DEFAULT_KWARGS[tool_id] = dict(kwargs)


def _tool_class(tool_id: str, setting: str) -> Any:
    if tool_id in TOOLS:
        return TOOLS.get(tool_id, setting)
    if ":" not in tool_id:
        raise ConfigError(
            f"unknown tool {tool_id!r}; known names: {', '.join(TOOLS.names())}, or a Tool class's import path "
            "'my_pkg.tools:MyTool'"
        )
    cls = import_target(tool_id, setting)
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ConfigError(f"tool_id {tool_id!r} is not a roll.agentic.tools.Tool subclass")
    return cls


def check_tool(tool_id: str, tool_args: Mapping[str, Any], *, setting: str = "tool_id") -> Any:
    """The Tool class of ``tool_id`` (a registered name or ``"module:Class"``), once ``tool_args`` (with the
    registered defaults) are known to fit its constructor, without building it (``roll validate``). A tool module that
    fails while importing (a SyntaxError, an ImportError inside it, an error its top level raises) is a
    ``ModuleImportError`` naming ``setting`` (the config field ``tool_id`` came from), the file and line."""
    cls = _tool_class(tool_id, setting)
    arguments = {**_DEFAULT_KWARGS.get(tool_id, {}), **tool_args}
    arguments.pop("tool_instruction", None)
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return cls
    try:
        bound = signature.bind(**arguments)
    except TypeError as e:
        accepted = [n for n, p in signature.parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        raise ConfigError(
            f"tool {tool_id!r} cannot be built with tool_args {sorted(tool_args)} ({e}); accepted: "
            f"{[*accepted, 'tool_instruction']}"
        ) from None
    check_args = getattr(cls, "check_args", None)  # a tool's own checks of what it needs on this machine
    if callable(check_args):
        check_args(**bound.arguments)
    return cls


def make_tool(tool_id: str, **kwargs: Any) -> Tool:
    """An instance of ``tool_id`` (a registered name or a Tool class's ``"module:Class"``) built with its registered
    defaults updated by ``kwargs``; ``tool_instruction`` (any tool) replaces the generated description the model is
    shown (see :class:`~roll.agentic.tools.Tool`)."""
    cls = check_tool(tool_id, kwargs)
    arguments = {**_DEFAULT_KWARGS.get(tool_id, {}), **kwargs}
    instruction = arguments.pop("tool_instruction", None)
    if instruction is not None and not isinstance(instruction, str):
        raise ConfigError(f"tool {tool_id!r}: tool_instruction must be a string, got {instruction!r:.80}")
    tool = cls(**arguments)
    if not isinstance(tool, Tool):
        raise ConfigError(f"tool {tool_id!r} built a {type(tool).__name__}, which is not a roll.agentic.tools.Tool")
    if instruction is not None:
        tool.tool_instruction = instruction
    return tool


register_tool("python_code", "roll.agentic.tools.python_code:PythonCodeTool")
register_tool("search", "roll.agentic.tools.search:SearchTool")
register_tool("mcp", "roll.agentic.tools.mcp:MCPTool", package="roll-agentic", extra="mcp")
