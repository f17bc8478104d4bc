"""sokoban_sandbox on ROCK's SDK (RockGameSandbox) against an in-process fake of the ROCK service's sandbox endpoints.

The real SDK code runs (rl-rock's ``Sandbox.start`` / ``get_status`` / ``create_session`` / ``arun`` / ``stop`` over
HTTP); the fake hands the commands of ``run_in_session`` to a :class:`LocalSandbox`, so roll's real game server and
client answer them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("rock.sdk.sandbox.client")

from roll.agentic.env import SokobanEnv, make_env
from roll.agentic.env.rock.testing import FakeRockService
from roll.agentic.env.sokoban_sandbox import SandboxGameError
from roll.agentic.env.sokoban_sandbox.local import LocalSandbox, live_processes
from roll.agentic.env.sokoban_sandbox.rock_sandbox import RockGameSandbox

pytestmark = pytest.mark.extra("rock")


class FakeRock(FakeRockService):
    """The ROCK service whose sandbox is a :class:`LocalSandbox`: its sessions run the commands sent to them."""

    def __init__(self) -> None:
        super().__init__()
        self.box: LocalSandbox | None = None

    def handle(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        box = self.box
        if name == "start_async":
            self.box = LocalSandbox(None)
            self.box.start()
        elif name == "create_session" and box is not None:
            box.create_session(body["session"])
            return {"output": ""}
        elif name == "run_in_session" and box is not None:
            return {"output": box.run(body["command"], body["session"], 30), "exit_code": 0}
        elif name == "stop" and box is not None:
            box.stop()
        return super().handle(name, body)


@pytest.fixture
def rock_service() -> Iterator[FakeRock]:
    with FakeRock() as service:
        try:
            yield service
        finally:
            if service.box is not None:
                service.box.stop()


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
    names = rock_service.names
    assert names[0] == "start_async" and names[-1] == "stop"
    start = rock_service.calls[0].body
    assert (start["image"], start["auto_clear_time"]) == ("me/sokoban-sandbox:1", 10)
    sessions = [body["session"] for name, body, _ in rock_service.calls if name == "create_session"]
    assert sessions == ["default", "server_session"]
    runs = [(body["session"], body["command"]) for name, body, _ in rock_service.calls if name == "run_in_session"]
    assert runs[0] == ("server_session", "cd /app && python server.py &")
    assert runs[-1] == ("default", "cd /app && python client.py action '<answer>Up</answer>' --json")
    assert box is not None and box.root is None and live_processes(box.groups) == []


def test_an_image_that_does_not_start_fails_the_reset_and_the_sandbox_is_stopped(rock_service: FakeRock) -> None:
    rock_service.pull_fails = True
    env = make_env("sokoban_sandbox", base_url=rock_service.url, startup_timeout=10, sandbox_cls=RockGameSandbox)
    with pytest.raises(SandboxGameError, match="no such image"):
        env.reset(seed=0)
    assert rock_service.names[-1] == "stop"
    assert rock_service.calls[-1].body == {"sandbox_id": "sb-1"}
