"""A Sokoban game served over MCP, for the ``sokoban_mcp`` env type (ROLL has the env but ships no server)::

    pip install 'roll-agentic[mcp]'
    python -m roll.agentic.env.sokoban_mcp_server --port 8000 [--dim-room 6 6 --num-boxes 1 --max-steps 100]

serves MCP on one port over SSE at ``http://HOST:PORT/sse`` (ROLL's transport) and over streamable HTTP at
``http://HOST:PORT/mcp``. Its two tools answer JSON text with ROLL's keys ``Observation`` (the room, ROLL's symbols),
``Reward``, ``Game End`` and ``info`` (``success``, ``action_is_effective``, ``action_is_valid``, ``steps``):

* ``reset(seed)``: a new game, the room :class:`~roll.agentic.env.sokoban.SokobanEnv` draws for ``seed`` with the
  server's settings (no seed: a random one);
* ``play(action)``: one move, ROLL's ids 1 Up, 2 Down, 3 Left, 4 Right, with SokobanEnv's rewards (-0.1 a move, +1 a
  box onto a target, -1 off one, +10 when all are on). The game ends when it is solved or after ``--max-steps`` moves;
  a move before ``reset``, after the end, or with another id is a tool error.

Each MCP session (one SSE connection, one streamable-HTTP session id) has its own game, so envs that share a server
never share a room. The server keeps the games of the ``--max-games`` sessions used last (a session's game lives
on after the session, as nothing tells the tools that it ended; a session older than that gets "call reset first").
"""

from __future__ import annotations

import argparse
import json
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from roll.agentic.env.sokoban import SokobanEnv
from roll.runtime import import_extra

# the server is a program of the extra: without it, say how to get it
import_extra("mcp.server.mcpserver.exceptions", "the Sokoban MCP server", "roll-agentic", "mcp")
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

__all__ = ["ACTION_IDS", "build_app", "build_server", "main"]


#: ROLL's action ids (``action_lookup`` of its sokoban envs).
ACTION_IDS = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}


def _answer(observation: str, reward: float, game_end: bool, info: dict[str, Any]) -> str:
    return json.dumps({"Observation": observation, "Reward": reward, "Game End": game_end, "info": info})


def _session_key(ctx: Context) -> str:
    """The MCP session a call belongs to: its streamable-HTTP session id or its SSE connection's id (the SDK makes a
    new ServerSession object per request, so the object cannot be the key); one key for an in-process client."""
    request = ctx.request_context.request
    if request is None:
        return "local"
    headers = getattr(request, "headers", None) or {}
    query = getattr(request, "query_params", None) or {}
    key = headers.get("mcp-session-id") or query.get("session_id")
    if not key:  # a sessionless request would share one game with every other: refuse it
        raise ToolError(
            "this server keeps one game per MCP session: connect over SSE or streamable HTTP with a session"
        )
    return str(key)


def build_server(
    *,
    dim_room: Sequence[int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 30,
    max_steps: int = 100,
    max_games: int = 10_000,
) -> MCPServer:
    """The MCP server with the ``reset`` and ``play`` tools; games are SokobanEnv's with these settings."""
    server: MCPServer = MCPServer("sokoban", instructions="Sokoban: reset(seed) starts a game, play(action) moves.")
    games: OrderedDict[str, SokobanEnv] = OrderedDict()  # session -> its game, the session used last at the end
    ended: set[str] = set()  # sessions whose game is over
    lock = threading.Lock()  # the SDK runs sync tools on worker threads: one call at a time changes the tables

    @server.tool()
    def reset(ctx: Context, seed: int | None = None) -> str:
        """Start a new Sokoban game; the same seed gives the same room."""
        key = _session_key(ctx)
        game = SokobanEnv(dim_room=list(dim_room), num_boxes=num_boxes, search_depth=search_depth, max_steps=max_steps)
        room, _ = game.reset(random.randrange(2**31) if seed is None else seed)  # drawn outside the lock: the slow part
        with lock:
            games[key] = game
            games.move_to_end(key)
            ended.discard(key)
            while len(games) > max_games:
                ended.discard(games.popitem(last=False)[0])
        return _answer(room, 0.0, False, {"success": False, "action_is_effective": False, "steps": 0})

    @server.tool()
    def play(ctx: Context, action: int) -> str:
        """Move the player: 1 Up, 2 Down, 3 Left, 4 Right."""
        key = _session_key(ctx)
        with lock:
            game = games.get(key)
            if game is None:
                raise ToolError("no game in this session: call reset first")
            games.move_to_end(key)
            if key in ended:
                raise ToolError("the game has ended: call reset for a new one")
            if action not in ACTION_IDS:
                raise ToolError(f"action {action!r} is not one of {ACTION_IDS}")
            room, reward, terminated, truncated, step_info = game.step(f"<answer>{ACTION_IDS[action]}</answer>")
            if terminated or truncated:
                ended.add(key)
            info = {
                "success": bool(step_info["success"]),
                "action_is_effective": bool(step_info["action_is_effective"]),
                "action_is_valid": True,
                "steps": game.steps,
            }
            return _answer(room, reward, bool(terminated or truncated), info)

    return server


def build_app(server: MCPServer, *, host: str = "127.0.0.1") -> Any:
    """One Starlette app serving ``server`` over SSE (``/sse``, ``/messages/``) and streamable HTTP (``/mcp``)."""
    from starlette.applications import Starlette  # pants: no-infer-dep (the mcp extra brings it)

    sse = server.sse_app(host=host)
    http = server.streamable_http_app(host=host)
    # the streamable-HTTP session manager runs in its app's lifespan: the combined app keeps it
    return Starlette(routes=[*sse.routes, *http.routes], lifespan=http.router.lifespan_context)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m roll.agentic.env.sokoban_mcp_server",
        description="Serve Sokoban games over MCP (SSE at /sse, streamable HTTP at /mcp) for env_type sokoban_mcp.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--dim-room", type=int, nargs=2, default=[6, 6], metavar=("ROWS", "COLS"))
    parser.add_argument("--num-boxes", type=int, default=1)
    parser.add_argument("--search-depth", type=int, default=30, help="how far rooms are scrambled from solved")
    parser.add_argument("--max-steps", type=int, default=100, help="moves after which a game ends unsolved")
    parser.add_argument("--max-games", type=int, default=10_000, help="games kept, of the sessions used last")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if min(args.max_steps, args.num_boxes, args.max_games) < 1 or min(args.dim_room) < 3:
        parser.error("--max-steps, --num-boxes and --max-games must be >= 1, and --dim-room at least 3 3")
    import uvicorn  # pants: no-infer-dep (the mcp extra brings it)

    server = build_server(
        dim_room=args.dim_room,
        num_boxes=args.num_boxes,
        search_depth=args.search_depth,
        max_steps=args.max_steps,
        max_games=args.max_games,
    )
    print(f"Sokoban MCP server: http://{args.host}:{args.port}/sse (SSE), /mcp (streamable HTTP)", flush=True)
    uvicorn.run(build_app(server, host=args.host), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
