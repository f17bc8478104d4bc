"""Tools by id, resolved lazily: ``register_tool(id, "module:Class", **default_kwargs)``, ``make_tool(id, **kw)``.

Built in: ``python_code`` (roll's code sandbox), ``search`` (BM25 over a local document file, or a pluggable
backend) and ``mcp`` (the tools of an MCP server over stdio; needs ``roll-agentic[mcp]``). Third-party packages
add tools through the ``roll.agentic.tools`` entry-point group.
"""

from __future__ import annotations

from typing import Any

from roll.agentic.tools.base import Tool
from roll.runtime import ConfigError, Registry

__all__ = ["TOOLS", "make_tool", "register_tool"]

TOOLS: Registry[Any] = Registry("tool", entry_point_group="roll.agentic.tools")
_DEFAULT_KWARGS: dict[str, dict[str, Any]] = {}


def register_tool(
    tool_id: str, target: str | Any, *, package: str | None = None, extra: str | None = None, **kwargs: Any
) -> None:
    """Register a Tool class (or its ``"module:Class"`` path) as ``tool_id``; ``kwargs`` are default arguments."""
    TOOLS.register(tool_id, target, package=package, extra=extra)
    _DEFAULT_KWARGS[tool_id] = dict(kwargs)


def make_tool(tool_id: str, **kwargs: Any) -> Tool:
    """An instance of ``tool_id`` built with its registered defaults updated by ``kwargs``; ``tool_instruction``
    (any tool) replaces the generated description the model is shown (see :class:`~roll.agentic.tools.Tool`)."""
    cls = TOOLS.get(tool_id)
    arguments = {**_DEFAULT_KWARGS.get(tool_id, {}), **kwargs}
    instruction = arguments.pop("tool_instruction", None)
    if instruction is not None and not isinstance(instruction, str):
        raise ConfigError(f"tool {tool_id!r}: tool_instruction must be a string, got {instruction!r:.80}")
    try:
        tool = cls(**arguments)
    except TypeError as e:
        raise ConfigError(f"tool {tool_id!r} cannot be built with tool_args {sorted(kwargs)}: {e}") from None
    if not isinstance(tool, Tool):
        raise ConfigError(f"tool {tool_id!r} built a {type(tool).__name__}, which is not a roll.agentic.tools.Tool")
    if instruction is not None:
        tool.tool_instruction = instruction
    return tool


register_tool("python_code", "roll.agentic.tools.python_code:PythonCodeTool")
register_tool("search", "roll.agentic.tools.search:SearchTool")
register_tool("mcp", "roll.agentic.tools.mcp:MCPTool", package="roll-agentic", extra="mcp")
