"""roll's Sokoban game server for the ``sokoban_sandbox`` image: ``cd /app && python server.py``.

Standard library only. The rooms come from roll's generator and answers are read with roll's parser, both copied
next to this file by :func:`roll.agentic.env.sokoban_sandbox.app.write_app` (``roll/agentic/env/sokoban_gen.py`` and
``parsing.py``, found through the namespace folders ``roll/agentic/env`` when roll is not installed). One game per
server: the sandbox belongs to one env. HTTP on ``127.0.0.1:$SOKOBAN_PORT`` (8001 unless set; ``--host``, ``--port``
override):

* ``GET /``: 200 ``ok`` (the env's health check);
* ``POST /reset`` with ``{"seed": int | null}``: a new game, the room :class:`~roll.agentic.env.sokoban.SokobanEnv`
  draws for that seed with the same settings (no seed: a random one);
* ``POST /step`` with ``{"action": "<answer>Up</answer>"}``: one move, read as SokobanEnv reads it (ROLL's
  ``<answer>`` pattern, case-insensitive Up/Down/Left/Right), with its rewards (-0.1 a move, +1 a box onto a target,
  -1 one off, +10 when all are on; an unreadable answer costs the move's -0.1 and moves nothing).

Both answer ``{"observation", "reward", "terminated", "truncated", "info"}``: the observation is the rules (reset) or
what the move did (step); ``info["suffix"]`` is ``"Current map:"`` and the room on the next lines, plus ``success``,
``action_is_valid``, ``action_is_effective`` and ``steps``. Solving terminates; ``--max-steps`` moves truncate. A
step before a reset or after the end is answered 409 with ``{"error": ...}``; a body that is not JSON, 400.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from roll.agentic.env.parsing import ACTION_PATTERN, parse_action
from roll.agentic.env.sokoban_gen import TARGET, WALL, Room, generate_room, push

ACTIONS = ("Up", "Down", "Left", "Right")
# SokobanEnv's symbols and rewards (roll's tests check that this game plays as SokobanEnv does).
GRID_LOOKUP = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
STEP_PENALTY, BOX_ON_REWARD, BOX_OFF_PENALTY, FINISH_REWARD = -0.1, 1.0, -1.0, 10.0
RULES = (
    "Sokoban: you are the player P and must push every box X onto a target O. Walk into a box to push it one cell; "
    "boxes cannot be pulled nor pushed into walls (#) or other boxes. Symbols: # wall, _ floor, O target, X box, "
    "√ box on target, P player, S player on target. Answer one move per turn, one of Up, Down, Left, Right, "
    "as <answer>Right</answer>."
)
DEFAULT_PORT = 8001


class GameOver(Exception):
    """A move that the game refuses (none started, or it has ended)."""


class Game:
    """One Sokoban game at a time, with SokobanEnv's settings, rooms, rewards and limits."""

    def __init__(
        self, dim_room: Sequence[int] = (6, 6), num_boxes: int = 1, search_depth: int = 30, max_steps: int = 20
    ):
        self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        self.num_boxes, self.search_depth, self.max_steps = num_boxes, search_depth, max_steps
        self.room: Room | None = None
        self.boxes: frozenset[tuple[int, int]] = frozenset()
        self.player = (0, 0)
        self.steps = 0
        self.over = False

    def reset(self, seed: int | None) -> dict[str, Any]:
        self.room = generate_room(self.dim_room, self.num_boxes, self.search_depth, random.Random(seed))
        self.boxes, self.player, self.steps, self.over = self.room.boxes, self.room.player, 0, False
        return self._answer(RULES, 0.0, False, False, valid=True, effective=False)

    def step(self, text: str) -> dict[str, Any]:
        if self.room is None:
            raise GameOver("no game yet: reset first")
        if self.over:
            raise GameOver("the game has ended: reset for a new one")
        self.steps += 1
        action = parse_action(text, ACTION_PATTERN, ACTIONS).action
        reward, effective = STEP_PENALTY, False
        if action is None:
            said = "your reply held no valid action; answer like <answer>Right</answer>"
        else:
            targets = self.room.targets
            on_before, before = len(self.boxes & targets), self.player
            self.player, self.boxes, _ = push(self.room, self.boxes, self.player, action)
            on_after = len(self.boxes & targets)
            reward += BOX_ON_REWARD * max(0, on_after - on_before) + BOX_OFF_PENALTY * max(0, on_before - on_after)
            effective = self.player != before
            said = f"you moved {action}" if effective else f"you tried to move {action}, but nothing moved"
        success = self.boxes <= self.room.targets
        if success:
            reward += FINISH_REWARD
        truncated = not success and self.steps >= self.max_steps
        self.over = success or truncated
        ending = " The puzzle is solved!" if success else " No moves left." if truncated else ""
        observation = f"Turn {self.steps}: {said}.{ending}"
        return self._answer(observation, reward, success, truncated, valid=action is not None, effective=effective)

    def render(self) -> str:
        assert self.room is not None
        rows = []
        for r, row in enumerate(self.room.fixed):
            cells = []
            for c, fixed in enumerate(row):
                if (r, c) == self.player:
                    code = 6 if fixed == TARGET else 5
                elif (r, c) in self.boxes:
                    code = 3 if fixed == TARGET else 4
                else:
                    code = 0 if fixed == WALL else 2 if fixed == TARGET else 1
                cells.append(GRID_LOOKUP[code])
            rows.append("".join(cells))
        return "\n".join(rows)

    def _answer(
        self, observation: str, reward: float, terminated: bool, truncated: bool, *, valid: bool, effective: bool
    ) -> dict[str, Any]:
        assert self.room is not None
        info = {
            "suffix": f"Current map:\n{self.render()}",
            "success": self.boxes <= self.room.targets,
            "action_is_valid": valid,
            "action_is_effective": effective,
            "steps": self.steps,
        }
        return {
            "observation": observation,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
        }


def make_handler(game: Game) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # one move at a time

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the sandbox's server session is not read

        def _send(self, status: int, body: Any) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, "ok") if self.path.split("?")[0] == "/" else self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                seed = body.get("seed")
                if self.path == "/reset" and seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                    raise ValueError(f"seed must be an integer, got {seed!r}")
            except ValueError as e:
                self._send(400, {"error": f"bad request: {e}"})
                return
            with lock:
                try:
                    if self.path == "/reset":
                        self._send(200, game.reset(seed))
                    elif self.path == "/step":
                        self._send(200, game.step(str(body.get("action", ""))))
                    else:
                        self._send(404, {"error": f"no endpoint {self.path}"})
                except GameOver as e:
                    self._send(409, {"error": str(e)})

    return Handler


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve one Sokoban game over HTTP (roll's sokoban_sandbox app).")
    parser.add_argument("--host", default=os.environ.get("SOKOBAN_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SOKOBAN_PORT", DEFAULT_PORT)))
    parser.add_argument("--dim-room", type=int, nargs=2, default=[6, 6], metavar=("ROWS", "COLS"))
    parser.add_argument("--num-boxes", type=int, default=1)
    parser.add_argument("--search-depth", type=int, default=30, help="how far rooms are scrambled from solved")
    parser.add_argument("--max-steps", type=int, default=20, help="moves after which a game ends unsolved")
    args = parser.parse_args(argv)
    if min(args.num_boxes, args.search_depth, args.max_steps) < 1 or min(args.dim_room) < 4 or max(args.dim_room) < 5:
        parser.error("--num-boxes, --search-depth and --max-steps must be >= 1, and --dim-room at least 4 5")
    game = Game(args.dim_room, args.num_boxes, args.search_depth, args.max_steps)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(game))
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
