"""``mcp``: the tools of a Model Context Protocol server, started as a subprocess and spoken to over stdio, or
(``server_url``, ROLL's key) a running server spoken to over HTTP: with server-sent events (SSE, ROLL's transport), or
with streamable HTTP when the URL's path ends in ``/mcp`` (the SDK's default endpoint) or ``transport`` says so.

Needs ``pip install 'roll-agentic[mcp]'`` (the ``mcp`` SDK). The session lives on a private event loop in a
background thread, so the synchronous :meth:`MCPTool.call` (made from an env's ``step``) can use it; one server
process serves every call of the tool instance until :meth:`MCPTool.close`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import threading
from typing import Any

from roll.agentic.tools.base import Tool, ToolResult, ToolSpec
from roll.runtime import ConfigError, import_extra

__all__ = ["MCP_TRANSPORTS", "MCPTool", "MissingMCPToolsError", "import_mcp", "mcp_transport_of"]

MCP_TRANSPORTS = ("sse", "streamable_http")


class MissingMCPToolsError(ConfigError):
    """The MCP server answered but lacks tools that were asked for (``tool_names``): another server than meant."""


def import_mcp(what: str = "the mcp tool") -> Any:
    """The ``mcp`` SDK, or MissingExtraError naming ``what`` needs it and the pip command."""
    return import_extra("mcp", what, "roll-agentic", "mcp")


def mcp_transport_of(server_url: str, transport: str | None = None) -> str:
    """How to speak to the server at ``server_url``: ``transport`` when given, else streamable HTTP for a URL whose
    path ends in ``/mcp`` and SSE for any other."""
    if transport is None:
        path = server_url.split("?", 1)[0].rstrip("/")
        return "streamable_http" if path.endswith("/mcp") else "sse"
    if transport not in MCP_TRANSPORTS:
        raise ConfigError(f"the mcp transport {transport!r} is not one of {list(MCP_TRANSPORTS)}")
    return transport


def _text_of(result: Any) -> str:
    parts = []
    for item in getattr(result, "content", None) or []:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', type(item).__name__)} content]")
    return "\n".join(parts)


def _schema_of(tool: Any) -> dict[str, Any]:
    schema = getattr(tool, "input_schema", None)
    if schema is None:
        schema = getattr(tool, "inputSchema", None)  # the mcp 1.x spelling
    return dict(schema or {"type": "object", "properties": {}})


class MCPTool(Tool):
    """Every tool the server lists (or only ``tool_names``), each callable by its MCP name."""

    @staticmethod
    def check_args(
        command: str | None = None,
        cwd: str | None = None,
        server_url: str | None = None,
        transport: str | None = None,
        **_: Any,
    ) -> None:
        """``roll validate``: one of ``command`` and ``server_url``; the command is a program on this machine (on PATH,
        or a path), the server at ``server_url`` answers (any HTTP answer counts)."""
        from roll.pipelines.validate import NotHereError, ping_service

        if server_url is not None and command is None:
            mcp_transport_of(server_url, transport)
            what = f"the mcp tool's server_url {server_url!r}"
            ping_service(server_url, what, "start the MCP server or fix server_url", method="HEAD")
            return
        if command is None or server_url is not None:
            raise ConfigError("the mcp tool needs tool_args.command (a server to start) or server_url, one of them")
        found = shutil.which(command) or (shutil.which(command, path=cwd) if cwd else None)
        if not found and not os.path.isfile(os.path.join(cwd or "", command)):
            raise NotHereError(
                f"the mcp tool's command {command!r} is not a program on this machine (not on PATH, no such file): "
                "install it or give its full path in tool_args.command"
            )

    def __init__(
        self,
        command: str | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        tool_names: list[str] | None = None,
        timeout_s: float = 30.0,
        startup_timeout_s: float = 60.0,
        server_url: str | None = None,
        transport: str | None = None,
    ) -> None:
        mcp = import_mcp()
        if (command is None) == (server_url is None):
            raise ConfigError("the mcp tool needs tool_args.command (a server to start) or server_url, one of them")
        self._url = server_url
        self._transport_name = None if server_url is None else mcp_transport_of(server_url, transport)
        self._params = (
            None
            if command is None
            else mcp.StdioServerParameters(command=command, args=list(args or []), env=env, cwd=cwd)
        )
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="roll-mcp-client", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ended = threading.Event()  # set when the session (and with it the server process) is closed
        ready: concurrent.futures.Future[list[ToolSpec]] = concurrent.futures.Future()
        self._served = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            specs = ready.result(timeout=startup_timeout_s)
        except BaseException as e:
            self._served.cancel()  # a session still starting never waits for close()'s stop: end it now
            self.close()
            where = server_url if command is None else f"{command} {' '.join(args or [])}"
            raise ConfigError(f"the MCP server {where} did not start: {e}") from e
        if tool_names is not None:
            missing = sorted(set(tool_names) - {s.name for s in specs})
            if missing:
                self.close()
                raise MissingMCPToolsError(
                    f"the MCP server has no tools {missing}; it offers {[s.name for s in specs]}"
                )
            specs = [s for s in specs if s.name in tool_names]
        self._specs = specs

    async def _serve(self, ready: concurrent.futures.Future[list[ToolSpec]]) -> None:
        """Open the session, publish the tool list, and hold the session open until close()."""
        mcp = import_mcp()
        self._stop = asyncio.Event()
        try:
            async with self._transport(mcp) as (read, write), mcp.ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                self._session = session
                ready.set_result([ToolSpec(t.name, t.description or "", _schema_of(t)) for t in listed.tools])
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            self._session = None
            self._ended.set()

    def _transport(self, mcp: Any) -> Any:
        if self._url is None:
            return mcp.stdio_client(self._params)
        if self._transport_name == "streamable_http":
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self._url)
        from mcp.client.sse import sse_client

        return sse_client(self._url, timeout=self.timeout_s)

    @property
    def connected(self) -> bool:
        """Whether the session is open (False once it ended: closed, or its server or connection went away)."""
        return self._session is not None and not self._ended.is_set()

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in {s.name for s in self._specs}:
            return ToolResult(False, f"unknown tool {name!r}")
        session = self._session
        if session is None:
            return ToolResult(False, "the MCP server is not running")
        future = asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), self._loop)
        try:
            result = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return ToolResult(False, f"the tool {name!r} did not answer within {self.timeout_s:g} s")
        except Exception as e:  # a protocol or transport failure is a failed call, not a crash of the episode
            return ToolResult(False, f"the tool {name!r} failed: {type(e).__name__}: {e}")
        failed = getattr(result, "is_error", None)
        if failed is None:
            failed = getattr(result, "isError", False)  # the mcp 1.x spelling
        return ToolResult(not bool(failed), _text_of(result))

    def close(self) -> None:
        """Stop the session and the server process, then the background loop. Safe to call twice."""
        if self._loop.is_closed():
            return
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if not self._ended.wait(timeout=5):
            # still starting (a server that never answers initialize) or stuck: cancelling the session's task
            # leaves stdio_client, which ends the server process
            self._served.cancel()
            self._ended.wait(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
