"""A tiny MCP server for the mcp tool's tests: add two integers, or fail on purpose. Over stdio, or with the arguments
``sse PORT`` over HTTP (server-sent events) on 127.0.0.1:PORT/sse."""

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
    import sys

    if sys.argv[1:2] == ["sse"]:
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
