"""sokoban_sandbox on ROCK's SDK (RockGameSandbox) against an in-process fake of the ROCK service's sandbox endpoints.

The real SDK code runs (rl-rock's ``Sandbox.start`` / ``get_status`` / ``create_session`` / ``arun`` / ``stop`` over
HTTP); the fake hands the commands of ``run_in_session`` to a :class:`LocalSandbox`, so roll's real game server and
client answer them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("rock.sdk.sandbox.client")

from roll.agentic.env import SokobanEnv, make_env
from roll.agentic.env.sokoban_sandbox import SandboxGameError
from roll.agentic.env.sokoban_sandbox.local import LocalSandbox, live_processes
from roll.agentic.env.sokoban_sandbox.rock_sandbox import RockGameSandbox

pytestmark = pytest.mark.extra("rock")
PREFIX = "/apis/envs/sandbox/v1/"


class FakeRock(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.box: LocalSandbox | None = None
        self.pull_fails = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeRock

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, result: dict[str, Any]) -> None:
        data = json.dumps({"status": "Success", "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # get_status
        self.server.calls.append((self.path.removeprefix(PREFIX).split("?")[0], {}))
        failed = {"image_pull": {"status": "failed", "message": "no such image"}} if self.server.pull_fails else None
        self._answer({"sandbox_id": "sb-1", "host_name": "h", "is_alive": not failed, "status": failed})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        name = self.path.removeprefix(PREFIX)
        self.server.calls.append((name, body))
        box = self.server.box
        if name == "start_async":
            self.server.box = LocalSandbox(None)
            self.server.box.start()
            self._answer({"sandbox_id": "sb-1", "host_name": "h", "host_ip": "10.0.0.1"})
        elif name == "create_session" and box is not None:
            box.create_session(body["session"])
            self._answer({"output": ""})
        elif name == "run_in_session" and box is not None:
            output = box.run(body["command"], body["session"], 30)
            self._answer({"output": output, "exit_code": 0})
        else:
            if name == "stop" and box is not None:
                box.stop()
            self._answer({})


@pytest.fixture
def rock_service(monkeypatch) -> Iterator[FakeRock]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    server = FakeRock()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        if server.box is not None:
            server.box.stop()
        server.shutdown()
        server.server_close()


def _rock_sandbox_of(service: FakeRock) -> type[RockGameSandbox]:
    class Sandbox(RockGameSandbox):
        """ROCK's SDK as it is; only the game's port is the stand-in's (a real sandbox has 8001 to itself)."""

        @property
        def server_port(self) -> int:  # type: ignore[override]
            assert service.box is not None
            return service.box.server_port

    return Sandbox


def test_the_env_plays_through_rocks_sdk(rock_service: FakeRock) -> None:
    env = make_env(
        "sokoban_sandbox",
        base_url=rock_service.url,
        image="me/sokoban-sandbox:1",
        auto_clear_seconds=600,
        sandbox_cls=_rock_sandbox_of(rock_service),
    )
    try:
        _, info = env.reset(seed=6)
        assert env.render() == SokobanEnv().reset(6)[0] and info["suffix"].startswith("Current map:\n")
        _, reward, _, _, info = env.step("<answer>Up</answer>")
        assert info["action_is_valid"] is True and reward <= 0.0
    finally:
        box = rock_service.box
        env.close()
    names = [name for name, _ in rock_service.calls]
    assert names[0] == "start_async" and names[-1] == "stop"
    start = rock_service.calls[0][1]
    assert (start["image"], start["auto_clear_time"]) == ("me/sokoban-sandbox:1", 10)
    sessions = [body["session"] for name, body in rock_service.calls if name == "create_session"]
    assert sessions == ["default", "server_session"]
    runs = [(body["session"], body["command"]) for name, body in rock_service.calls if name == "run_in_session"]
    assert runs[0] == ("server_session", "cd /app && python server.py &")
    assert runs[-1] == ("default", "cd /app && python client.py action '<answer>Up</answer>' --json")
    assert box is not None and box.root is None and live_processes(box.groups) == []


def test_an_image_that_does_not_start_fails_the_reset_and_the_sandbox_is_stopped(rock_service: FakeRock) -> None:
    rock_service.pull_fails = True
    env = make_env("sokoban_sandbox", base_url=rock_service.url, startup_timeout=10, sandbox_cls=RockGameSandbox)
    with pytest.raises(SandboxGameError, match="no such image"):
        env.reset(seed=0)
    assert [name for name, _ in rock_service.calls][-1] == "stop"
    assert rock_service.calls[-1][1] == {"sandbox_id": "sb-1"}
