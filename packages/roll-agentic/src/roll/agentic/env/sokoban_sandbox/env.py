"""ROLL's ``sokoban_sandbox``: Sokoban played by a game server inside a sandbox, one command per move.

At the first ``reset`` the env starts its sandbox (``sandbox_cls``, by default a ROCK sandbox of ``image`` at the ROCK
service ``base_url``: :mod:`~roll.agentic.env.sokoban_sandbox.rock_sandbox`, ``pip install 'roll-agentic[rock]'``),
waits until it is alive (``alive_timeout``), opens two bash sessions (``default`` for the client, ``server_session``
for the server), starts the server (``cd /app && python server.py &``) and polls it with ``curl`` until it answers
200 (``server_start_timeout``). The sandbox then serves every episode until ``close()``. ``reset(seed)`` runs
``cd /app && python client.py reset --seed N --json`` in the client session, ``step(action)`` runs ``... action
'<the reply, shell-quoted, newlines as spaces>' --json``; the client prints the game's JSON ``{observation, reward,
terminated, truncated, info}``, and ``info["suffix"]`` ("Current map:" and the room) is the map ``render()`` returns
(the agent template's ``{suffix}``). roll's own server and client for that contract, and a Dockerfile, come from
``python -m roll.agentic.env.sokoban_sandbox.app --write-app DIR`` (:mod:`roll.agentic.env.sokoban_sandbox.app`);
:class:`~roll.agentic.env.sokoban_sandbox.local.LocalSandbox` runs them on this machine, without ROCK.

Faults: a sandbox that does not start, come alive or serve the game in time is stopped and ``reset`` raises
:class:`SandboxGameError` (the runner fails the episode: ``env_error``); the next reset starts a new sandbox. So does
a reset whose answer is not the game's JSON. A step whose command fails or whose answer is not the game's JSON ends
the episode (truncated, reward 0, ``info["error"]``, ``info["raw_output"]`` and ``info["failure_mode"]``); a failed
command also stops the sandbox, started again at the next reset. ``close()`` stops the sandbox; safe to call twice.

Follows ROLL's ``roll/pipeline/agentic/env/sandbox/sokoban_sandbox_env.py``; differences: the image, timeouts and
sandbox class are settings (ROLL hard-codes them; ``base_url`` and ``server_start_timeout`` are ROLL's keys); seed 0
is a seed (ROLL drops a falsy seed and plays a random room); a bad reset raises instead of returning an error
observation to play on; a bad step truncates the episode (ROLL: terminated) and names the failure; a start that
fails is not retried (ROLL retries network errors three times, sleeping up to 30 s): the next reset tries again;
``success`` and ``action_is_valid`` are also put in ``info`` and its ``metrics`` for roll's episode metrics.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import shlex
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import Field

from roll.agentic.env.base import Env, ResetOutput, StepOutput
from roll.runtime import RollError, RollModel, import_target
from roll.runtime.config import check_settings

__all__ = ["GameSandbox", "SandboxGameError", "SokobanSandboxConfig", "SokobanSandboxEnv"]

logger = logging.getLogger(__name__)

ENV_TYPE = "sokoban_sandbox"
ROLL_IMAGE = "rock-n-roll-registry.cn-hangzhou.cr.aliyuncs.com/rock/sokoban-sandbox:latest"
ROCK_SANDBOX = "roll.agentic.env.sokoban_sandbox.rock_sandbox:RockGameSandbox"
CLIENT_SESSION, SERVER_SESSION = "default", "server_session"
HEALTHY = "HC_CODE_200_HC_CODE"
ACTIONS = ("Up", "Down", "Left", "Right")
_SAMPLER = random.Random()


class SandboxGameError(RollError):
    """The sandbox or its game server failed (start, health, an answer that is not the game's JSON)."""


class SokobanSandboxConfig(RollModel):
    """``env_config`` of a ``sokoban_sandbox`` entry (ROLL's keys: ``base_url``, ``server_start_timeout``)."""

    base_url: str = Field(default="http://localhost:8080", description="The ROCK service (ROLL's key).")
    server_start_timeout: float = Field(
        default=60, gt=0, description="Seconds for the game server to answer its health check (ROLL's key)."
    )
    image: str = Field(default=ROLL_IMAGE, description="The sandbox image, with the game in /app (ROLL's, fixed).")
    auto_clear_seconds: int = Field(default=7200, gt=0, description="ROCK reclaims a sandbox left this long.")
    startup_timeout: float = Field(default=360, gt=0, description="Seconds for the sandbox to start.")
    alive_timeout: float = Field(default=180, gt=0, description="Seconds for a started sandbox to report alive.")
    command_timeout: float = Field(default=60, gt=0, description="Seconds for one command in the sandbox.")
    server_args: str = Field(
        default="", description="Appended to `python server.py` (roll's server: --dim-room R C, --num-boxes, ...)."
    )
    sandbox_cls: Any = Field(
        default=ROCK_SANDBOX,
        description="The sandbox class ('module:Class' or the class), built as cls(config); "
        "roll.agentic.env.sokoban_sandbox.local:LocalSandbox runs the game on this machine.",
    )

    def start_limit_s(self) -> float:
        """The longest a first ``reset`` (sandbox start, alive wait, server start) may take, plus the reset itself."""
        return self.startup_timeout + self.alive_timeout + self.server_start_timeout + 3 * self.command_timeout


def check_config(env_config: dict[str, Any]) -> SokobanSandboxConfig:
    """``env_config`` as settings, or one ConfigError naming each bad key (and the accepted ones)."""
    accepted = list(SokobanSandboxConfig.model_fields)
    return check_settings(
        SokobanSandboxConfig, env_config, ENV_TYPE, root="env_config", hint=f"; accepted keys: {accepted}"
    )


class GameSandbox(Protocol):
    """What ``sokoban_sandbox`` needs of a sandbox (``sandbox_cls``, built as ``cls(config)``)."""

    sandbox_id: str
    server_port: int
    """The port the game server listens on inside the sandbox (the health check's URL)."""

    def start(self) -> None: ...
    def is_alive(self) -> bool: ...
    def create_session(self, name: str) -> None: ...
    def run(self, command: str, session: str, timeout: float) -> str:
        """The command's output (stdout and stderr); raises when it cannot run or takes over ``timeout``."""
        ...

    def stop(self) -> None:
        """Stop the sandbox and what runs in it; safe to call twice and after a failed start."""
        ...


def _wait(check: Callable[[], bool], timeout: float, interval: float) -> bool:
    """Whether ``check()`` held within ``timeout`` seconds, polled at growing intervals up to ``interval`` (an error
    in a check counts as not yet)."""
    deadline, pause = time.monotonic() + timeout, min(0.1, interval)
    while True:
        try:
            if check():
                return True
        except Exception as e:  # a service still starting answers with errors: polled again until the deadline
            logger.debug("sokoban_sandbox: not ready yet: %s", e)
        if time.monotonic() + pause > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, interval)


class _BadAnswer(ValueError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _read(raw: str) -> dict[str, Any]:
    """The game's answer, or :class:`_BadAnswer` saying what is wrong with it (missing end flags read as ROLL reads
    them: terminated, not truncated)."""
    try:
        answer = json.loads(raw)
    except json.JSONDecodeError:
        raise _BadAnswer("JSONDecodeError", "its output is not JSON") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("observation"), str):
        raise _BadAnswer("BadAnswer", "its JSON has no 'observation' text")
    reward, info = answer.get("reward", 0), answer.get("info", {})
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise _BadAnswer("BadAnswer", f"its 'reward' is not a number: {reward!r}")
    if not isinstance(info, dict):
        raise _BadAnswer("BadAnswer", f"its 'info' is not an object: {info!r}")
    flags = [answer.get("terminated", True), answer.get("truncated", False)]
    if not all(isinstance(flag, bool) for flag in flags):
        raise _BadAnswer("BadAnswer", f"its 'terminated'/'truncated' are not booleans: {flags}")
    return {"observation": answer["observation"], "reward": float(reward), "flags": flags, "info": dict(info)}


class SokobanSandboxEnv(Env):
    """Sokoban in a sandbox (keys: :class:`SokobanSandboxConfig`)."""

    POLL_S = 1.0  # between health checks (each is a command in the sandbox)

    def __init__(self, **env_config: Any) -> None:
        self.config = check_config(env_config)
        target = self.config.sandbox_cls
        if target == ROCK_SANDBOX:  # without ROCK's SDK, say so (with the pip command) now, not at the first reset
            from roll.agentic.env.sokoban_sandbox.rock_sandbox import import_rock

            import_rock()
        self.sandbox_cls = import_target(target, "env_config.sandbox_cls") if isinstance(target, str) else target
        self.sandbox: GameSandbox | None = None
        self.map = "Game has not been reset yet."
        self.playing = False

    @classmethod
    def check_args(cls, **env_config: Any) -> str:
        """``roll validate``: the settings; for a ROCK sandbox, the SDK and the service (both warnings away from the
        run's machine)."""
        config = check_config(env_config)
        if config.sandbox_cls != ROCK_SANDBOX:
            return f"sandbox_cls {getattr(config.sandbox_cls, '__name__', config.sandbox_cls)}"
        from roll.agentic.env.sokoban_sandbox.rock_sandbox import import_rock
        from roll.pipelines.validate import ping_service

        import_rock()
        ping_service(config.base_url, f"ROCK service {config.base_url}", "start it or fix env_config.base_url")
        return f"ROCK service {config.base_url}, image {config.image}"

    # --- episode ------------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> ResetOutput:
        self.playing = False
        if self.sandbox is None:
            self._start()
        command = (
            "python client.py reset --json" if seed is None else f"python client.py reset --seed {int(seed)} --json"
        )
        try:
            raw = self._run_client(command)
        except Exception as e:
            where = self._where()
            self.close()
            raise SandboxGameError(f"{ENV_TYPE}: reset failed in {where}: {type(e).__name__}: {e}") from e
        try:
            answer = _read(raw)
        except _BadAnswer as e:
            where = self._where()
            self.close()
            raise SandboxGameError(f"{ENV_TYPE}: the game's reset in {where} failed: {e}: {raw[:300]!r}") from None
        self.playing = True
        info = answer["info"]
        self._keep_map(info)
        info.setdefault("success", False)
        return answer["observation"], info

    def step(self, action: str) -> StepOutput:
        if self.sandbox is None or not self.playing:
            raise RuntimeError("SokobanSandboxEnv.step() without a running episode; call reset() first")
        text = action.replace("\n", " ").replace("\r", "")
        try:
            raw = self._run_client(f"python client.py action {shlex.quote(text)} --json")
        except Exception as e:
            where = self._where()
            self.close()  # a sandbox that cannot run a command is started again at the next reset
            return self._failed(type(e).__name__, str(e), f"command_failed in {where}: {type(e).__name__}: {e}")
        try:
            answer = _read(raw)
        except _BadAnswer as e:
            return self._failed(e.kind, raw, f"bad_answer: {e} in {self._where()}")
        info = answer["info"]
        self._keep_map(info)
        success = bool(info.get("success", False))
        valid = bool(info.get("action_is_valid", True))
        metrics = {"success": float(success), "action_is_valid": float(valid)}
        if "action_is_effective" in info:
            metrics["action_is_effective"] = float(bool(info["action_is_effective"]))
        info.update(success=success, action_is_valid=valid, metrics={**metrics, **(info.get("metrics") or {})})
        terminated, truncated = answer["flags"]
        self.playing = not (terminated or truncated)
        return answer["observation"], answer["reward"], terminated, truncated, info

    def render(self) -> str:
        return self.map

    def sample_random_action(self, seed: int | None = None) -> str:
        """A uniformly random move (a function of ``seed`` when given)."""
        rng = random.Random(seed) if seed is not None else _SAMPLER
        return f"<answer>{rng.choice(ACTIONS)}</answer>"

    def close(self) -> None:
        """Stop the sandbox (and the game server in it). Safe to call twice."""
        sandbox, self.sandbox = self.sandbox, None
        self.playing = False
        if sandbox is not None:
            try:
                sandbox.stop()
            except Exception as e:  # stopping is best effort: ROCK reclaims it after auto_clear_seconds
                logger.warning("%s: stopping sandbox %s failed: %s", ENV_TYPE, sandbox.sandbox_id or "?", e)

    # --- the sandbox --------------------------------------------------------------------------------------------
    def _start(self) -> None:
        c = self.config
        self.sandbox = sandbox = self.sandbox_cls(c)  # kept first: close() must reach one whose start failed
        try:
            sandbox.start()
            if not _wait(sandbox.is_alive, c.alive_timeout, self.POLL_S):
                raise SandboxGameError(f"it was not alive within alive_timeout={c.alive_timeout:g} s")
            sandbox.create_session(CLIENT_SESSION)
            sandbox.create_session(SERVER_SESSION)
            server = f"python server.py {c.server_args}".rstrip()
            sandbox.run(f"cd /app && {server} &", SERVER_SESSION, c.command_timeout)
            # curl's own limit and the command's keep one poll within server_start_timeout
            limit = min(c.server_start_timeout, c.command_timeout)
            health = (
                f"curl -s -m {math.ceil(limit)} -o /dev/null -w "
                f'"HC_CODE_%{{http_code}}_HC_CODE" http://localhost:{sandbox.server_port}/'
            )

            def healthy() -> bool:
                return HEALTHY in sandbox.run(health, CLIENT_SESSION, limit + 1)

            if not _wait(healthy, c.server_start_timeout, self.POLL_S):
                raise SandboxGameError(
                    f"its game server (`cd /app && {server}`) did not answer on port {sandbox.server_port} within "
                    f"server_start_timeout={c.server_start_timeout:g} s; check the image's /app (roll's: python -m "
                    "roll.agentic.env.sokoban_sandbox.app --write-app DIR)"
                )
        except BaseException as e:
            where = self._where()
            self.close()
            if isinstance(e, Exception):
                detail = str(e) if isinstance(e, SandboxGameError) else f"{type(e).__name__}: {e}"
                raise SandboxGameError(f"{ENV_TYPE}: {where} did not start: {detail}") from e
            raise

    def _run_client(self, command: str) -> str:
        assert self.sandbox is not None
        return self.sandbox.run(f"cd /app && {command}", CLIENT_SESSION, self.config.command_timeout).strip()

    def _where(self) -> str:
        sandbox_id = getattr(self.sandbox, "sandbox_id", "") or "?"
        return f"sandbox {sandbox_id} (image {self.config.image})"

    def _keep_map(self, info: dict[str, Any]) -> None:
        suffix = info.get("suffix")
        if isinstance(suffix, str):
            self.map = (suffix.split("\n", 1)[-1] if "\n" in suffix else suffix).strip()

    def _failed(self, error: str, raw_output: str, failure: str) -> StepOutput:
        """End the episode after a step the game did not answer."""
        logger.warning("%s: %s", ENV_TYPE, failure)
        self.playing = False
        info = {
            "error": error,
            "raw_output": raw_output[:2000],
            "failure_mode": failure,
            "success": False,
            "action_is_valid": True,  # the game failed, not the model's answer
            "metrics": {"success": 0.0},
        }
        return f"Error: the game in the sandbox did not answer ({error}).", 0.0, False, True, info


# The keys check_env lists (and binds) are the settings' fields.
SokobanSandboxEnv.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field.default)
        for name, field in SokobanSandboxConfig.model_fields.items()
    ]
)
