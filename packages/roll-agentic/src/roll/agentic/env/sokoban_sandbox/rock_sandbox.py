"""A ``sokoban_sandbox`` sandbox of a ROCK service, through ROCK's Python SDK (``pip install 'roll-agentic[rock]'``).

The only module of the env that imports ``rock``. ROCK's SDK is async: each sandbox owns one event-loop thread
(:class:`~roll.agentic.env.rock.sandbox.EventLoopThread`) and every call waits for its coroutine there, within the
env's timeouts (ROLL runs ``asyncio.run`` per call, a new loop each time).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from roll.agentic.env.rock.sandbox import EventLoopThread
from roll.runtime import import_extra

__all__ = ["SERVER_PORT", "RockGameSandbox", "import_rock"]

SERVER_PORT = 8001  # the port of the game server of ROLL's image (each sandbox has its own network)
_MARGIN_S = 30.0  # on top of a call's own timeout, for the HTTP round trip to the service


def import_rock() -> ModuleType:
    """ROCK's sandbox client module, or MissingExtraError with the pip command."""
    return import_extra("rock.sdk.sandbox.client", "sokoban_sandbox (ROCK sandboxes)", "roll-agentic", "rock")


class RockGameSandbox:
    """One sandbox of ``config.image`` at the ROCK service ``config.base_url`` (a SokobanSandboxConfig)."""

    server_port = SERVER_PORT

    def __init__(self, config: Any) -> None:
        self.client = import_rock()
        self.config = config
        self.sandbox_id = ""
        self._sandbox: Any = None
        self._loop = EventLoopThread()

    def start(self) -> None:
        from rock.sdk.sandbox.config import SandboxConfig

        c = self.config
        sandbox = self.client.Sandbox(
            SandboxConfig(
                base_url=c.base_url,
                image=c.image,
                auto_clear_seconds=c.auto_clear_seconds,
                startup_timeout=c.startup_timeout,
            )
        )
        self._sandbox = sandbox  # set first: stop() must reach a sandbox whose start failed half-way
        self._loop.call(sandbox.start(), timeout=c.startup_timeout + _MARGIN_S)
        self.sandbox_id = str(sandbox.sandbox_id or "")

    def is_alive(self) -> bool:
        status = self._loop.call(self._sandbox.get_status(), timeout=self.config.command_timeout + _MARGIN_S)
        return bool(getattr(status, "is_alive", False))

    def create_session(self, name: str) -> None:
        from rock.actions import CreateBashSessionRequest

        request = CreateBashSessionRequest(session=name)
        self._loop.call(self._sandbox.create_session(request), timeout=self.config.command_timeout + _MARGIN_S)

    def run(self, command: str, session: str, timeout: float) -> str:
        future = self._loop.submit(self._sandbox.arun(cmd=command, session=session, mode="normal"))
        try:
            observation = future.result(timeout + _MARGIN_S)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"`{command}` took over {timeout:g} s in ROCK sandbox {self.sandbox_id}") from None
        return str(getattr(observation, "output", "") or "")

    def stop(self) -> None:
        """Stop the sandbox; safe to call twice and after a failed start."""
        try:
            if self._sandbox is not None:
                sandbox, self._sandbox = self._sandbox, None
                self._loop.call(sandbox.stop(), timeout=self.config.command_timeout + _MARGIN_S)
        finally:
            self._loop.close()
