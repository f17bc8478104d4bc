"""One ROCK sandbox driven through ROCK's Python SDK (``pip install 'roll-agentic[rock]'``, package rl-rock).

:class:`RockSandbox` is the only module that imports ``rock``. It starts a sandbox from an image, installs ROCK's
agent in it (``RockAgent`` with the env's ``agent_config``: pre-init commands, runtime, the agent CLI and ROCK's
model service), starts the agent on a prompt and then relays the policy's replies to it: ``anti_call(i, reply)``
hands reply ``i`` to the agent through the model service and returns the agent's next LLM request (a JSON payload
with ``messages`` and ``tools``) or ``SESSION_END``. ``run`` and ``upload`` serve the task's tests. ROCK's SDK is
async; each sandbox owns one event-loop thread and every call waits for its coroutine there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, Protocol

from roll.agentic.env.rock.config import RockEnvConfig
from roll.runtime import import_extra

__all__ = ["EventLoopThread", "RockSandbox", "SandboxClient"]


class SandboxClient(Protocol):
    """What ``rock_tb_native_env`` needs from a sandbox (``sandbox_cls`` names the class; built per episode as
    ``cls(image, config)``)."""

    sandbox_id: str

    def start(self) -> None: ...
    def install_agent(self) -> None: ...
    def start_agent(self, prompt: str) -> None: ...
    def anti_call(self, index: int, response_payload: str | None) -> str: ...
    def run(self, command: str, timeout: float) -> tuple[int, str]: ...
    def upload(self, local_path: str, remote_path: str) -> None: ...
    def stop(self) -> None: ...


def _rock() -> Any:
    return import_extra("rock.sdk.sandbox.client", "rock_tb_native_env (ROCK sandboxes)", "roll-agentic", "rock")


class EventLoopThread:
    """An event loop on a daemon thread; ``call`` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="roll-rock-sandbox", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


class RockSandbox:
    """A sandbox of a ROCK service (``config.sandbox_base_url``) from ``image``."""

    TEST_SESSION = "roll-test"

    def __init__(self, image: str, config: RockEnvConfig) -> None:
        self.client = _rock()
        self.image, self.config = image, config
        self.sandbox_id = ""
        self._sandbox: Any = None
        self._agent: Any = None
        self._agent_run: concurrent.futures.Future[Any] | None = None
        self._sessions: set[str] = set()
        self._loop = EventLoopThread()

    def start(self) -> None:
        from rock.sdk.sandbox.config import SandboxConfig

        headers = {"XRL-Authorization": self.config.xrl_authorization} if self.config.xrl_authorization else {}
        sandbox = self.client.Sandbox(
            SandboxConfig(
                base_url=self.config.sandbox_base_url,
                image=self.image,
                auto_clear_seconds=self.config.auto_clear_seconds,
                startup_timeout=self.config.startup_timeout,
                user_id=self.config.user_id,
                experiment_id=self.config.experiment_id,
                extra_headers=headers,
            )
        )
        self._sandbox = sandbox  # set first: stop() must reach a sandbox whose start failed half-way
        self._loop.call(sandbox.start(), timeout=self.config.startup_timeout + 60)
        self.sandbox_id = str(sandbox.sandbox_id or "")
        alive = self._loop.call(sandbox.is_alive(), timeout=self.config.timeout)
        if not getattr(alive, "is_alive", False):
            raise RuntimeError(f"ROCK sandbox {self.sandbox_id} of image {self.image!r} started but is not alive")

    def install_agent(self) -> None:
        from rock.sdk.sandbox.agent.rock_agent import RockAgent, RockAgentConfig

        agent_config = RockAgentConfig(**self.config.rock_agent_config())
        agent = RockAgent(self._sandbox)
        self._sandbox.agent = agent
        self._loop.call(agent.install(agent_config))
        self._agent = agent

    def start_agent(self, prompt: str) -> None:
        if self._agent is None:
            raise RuntimeError("start_agent() before install_agent()")
        self._agent_run = self._loop.submit(self._agent.run(prompt=prompt))

    def anti_call(self, index: int, response_payload: str | None) -> str:
        if self._agent is None:
            raise RuntimeError("anti_call() before install_agent()")
        return str(self._loop.call(self._agent.model_service.anti_call_llm(index, response_payload)))

    def _session(self, name: str) -> None:
        from rock.actions import CreateBashSessionRequest

        if name not in self._sessions:
            request = CreateBashSessionRequest(session=name, env_enable=True, env={"HOME": "/root"})
            self._loop.call(self._sandbox.create_session(request), timeout=self.config.timeout)
            self._sessions.add(name)

    def run(self, command: str, timeout: float) -> tuple[int, str]:
        self._session(self.TEST_SESSION)
        observation = self._loop.call(
            self._sandbox.arun(command, session=self.TEST_SESSION, wait_timeout=int(timeout), mode="nohup"),
            timeout=timeout + 60,
        )
        code = getattr(observation, "exit_code", None)
        return (int(code) if code is not None else 1), str(getattr(observation, "output", "") or "")

    def upload(self, local_path: str, remote_path: str) -> None:
        response = self._loop.call(self._sandbox.upload_by_path(local_path, remote_path), timeout=self.config.timeout)
        if not getattr(response, "success", False):
            raise RuntimeError(f"upload of {local_path} to {remote_path} failed: {getattr(response, 'message', '')}")

    def stop(self) -> None:
        """Stop the agent and the sandbox; safe to call twice and after a failed start."""
        try:
            if self._agent_run is not None:
                self._agent_run.cancel()
                self._agent_run = None
            if self._sandbox is not None:
                sandbox, self._sandbox = self._sandbox, None
                self._loop.call(sandbox.stop(), timeout=self.config.timeout)
        finally:
            self._loop.close()
