"""RockSandbox (roll's client of ROCK's SDK) against an in-process fake of the ROCK service's sandbox endpoints.

The real SDK code runs (rl-rock's ``Sandbox.start`` / ``get_status`` / ``stop`` over HTTP). Only start and stop are
served: ROCK's agent install and its model service run commands inside the sandbox, which this fake does not emulate
(the episode logic above them is tested with the scripted sandbox, tests/env_manager/test_rock_env.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("rock.sdk.sandbox.client")

from roll.agentic.env.rock.config import RockEnvConfig
from roll.agentic.env.rock.sandbox import RockSandbox

pytestmark = pytest.mark.extra("rock")

PREFIX = "/apis/envs/sandbox/v1/"


class FakeRock(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.alive = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeRock

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        self.server.calls.append((path.removeprefix(PREFIX), {"query": query}, dict(self.headers)))
        status = None if self.server.alive else {"image_pull": {"status": "failed", "message": "no such image"}}
        self._answer(
            {
                "status": "Success",
                "result": {"sandbox_id": "sb-7", "host_name": "h", "is_alive": self.server.alive, "status": status},
            }
        )

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        name = self.path.removeprefix(PREFIX)
        self.server.calls.append((name, body, dict(self.headers)))
        if name == "start_async":
            self._answer(
                {"status": "Success", "result": {"sandbox_id": "sb-7", "host_name": "h", "host_ip": "10.0.0.7"}}
            )
        else:
            self._answer({"status": "Success", "result": {}})


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
        server.shutdown()
        server.server_close()


def _config(url: str) -> RockEnvConfig:
    return RockEnvConfig.model_validate(
        {
            "dataset_name": "unused.jsonl",
            "agent_config": {"agent_type": "default"},
            "sandbox_base_url": url,
            "xrl_authorization": "Bearer t0k",
            "auto_clear_seconds": 600,
            "startup_timeout": 20,
            "timeout": 20,
        }
    )


def test_start_and_stop_go_to_the_service(rock_service: FakeRock) -> None:
    box = RockSandbox("swebench/sweb.eval:t1", _config(rock_service.url))
    box.start()
    assert box.sandbox_id == "sb-7"
    box.stop()
    box.stop()  # twice is harmless
    names = [name for name, _, _ in rock_service.calls]
    assert names[0] == "start_async" and names[-1] == "stop" and names.count("stop") == 1
    start = rock_service.calls[0][1]
    assert (start["image"], start["auto_clear_time"]) == ("swebench/sweb.eval:t1", 10)
    assert rock_service.calls[0][2].get("XRL-Authorization") == "Bearer t0k"
    assert rock_service.calls[-1][1] == {"sandbox_id": "sb-7"}


def test_a_sandbox_that_fails_to_start_is_still_stopped(rock_service: FakeRock) -> None:
    rock_service.alive = False
    box = RockSandbox("no/such:image", _config(rock_service.url))
    with pytest.raises(Exception, match="no such image"):
        box.start()
    box.stop()
    assert [name for name, _, _ in rock_service.calls][-1] == "stop"
    assert rock_service.calls[-1][1] == {"sandbox_id": "sb-7"}
