"""A tiny MCP server over stdio for the mcp tool's tests: add two integers, or fail on purpose."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def explode(message: str) -> str:
    """Always raises."""
    raise ValueError(message)


if __name__ == "__main__":
    server.run("stdio")
