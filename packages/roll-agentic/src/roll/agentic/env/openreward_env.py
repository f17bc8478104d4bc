"""ROLL's ``openreward_env``: hosted OpenReward environments (e.g. ``kanishk/EndlessTerminals``) played through tool
calls. Needs the extra: ``pip install 'roll-agentic[openreward]'`` and an API key in ``OPENREWARD_API_KEY``.

Per episode (``reset(seed)``): task ``seed % num_tasks`` of ``split`` is opened as an OpenReward session; the
observation is the task's prompt as a user message (after a system message when ``system_prompt_template`` is set;
its ``{tools}`` placeholder becomes the tools' schemas, one JSON line each), and the reset ``info["tools"]`` holds
the session's tools as OpenAI function schemas, which the ``agent_native`` manager hands to the chat template. Each
``step(reply)`` reads the reply's tool calls with roll's Qwen3-Coder / Hermes reader
(:func:`~roll.agentic.env.tool_calls.assistant_message`) and forwards them, in order, to the session; each result
comes back as a ``tool`` message. A reply without a (readable) call gets a reminder to call a tool. A call the
environment refuses (unknown tool, arguments that do not fit) comes back as the tool's error and the episode goes
on. The episode ends when a tool reports ``finished`` (terminated) or after ``max_steps`` turns (truncated): the
rewards the tools gave are reduced by ``reward_reduction`` (with ``nonterminal_reward`` added to them first on a
truncation) and given on that last turn; earlier turns give 0.

Faults: a session that does not open (nor list its tools and prompt) after ``retry_max_attempts`` retries, waiting
``retry_backoff_seconds`` doubled each time, makes ``reset`` raise (the runner fails the episode: ``env_error``);
a tool call that fails on the server's side (the tool raised, the session died, the connection or its time ran
out) ends the episode at once, truncated, with ``info["failure_mode"]`` saying why. A call that hangs past the
entry's ``step_timeout_s`` (900 s unless set: a session may start a container) is the runner's ``env_timeout``. The session is closed when the episode ends, when a
call raises, at the next ``reset`` and on ``close()`` (which also closes the client).

Follows ROLL's ``roll/pipeline/agentic/env/openreward/openreward_env.py``; differences: a reply may hold several
calls (each runs; ROLL runs the first), the turn that reaches ``max_steps`` ends the episode (ROLL asks the model
once more and drops that reply), ``system_prompt_template`` is used (ROLL accepts it and never reads it), and a
server-side tool failure ends the episode (ROLL shows the error and plays on against the dead session), the reply
is an assistant message with its ``tool_calls`` and each result a ``tool`` message (ROLL keeps the raw reply and
sends results as user messages in ``<tool_response>``), and a refused key or unknown environment is a ConfigError
naming the setting. The SDK
reads ``OPENREWARD_URL`` (and ``OPENREWARD_SESSION_URL``) for a server other than openreward.ai.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from roll.agentic.env.tool_calls import assistant_message
from roll.runtime import ConfigError, import_extra
from roll.runtime.config import check_settings

__all__ = ["OpenRewardConfig", "OpenRewardEnv", "import_openreward", "openreward_api_key"]

logger = logging.getLogger(__name__)

API_KEY_VAR = "OPENREWARD_API_KEY"
INSTALLER = "roll.agentic.env.openreward_install"
NO_CALL = "No tool call found in your reply. Call one of the provided tools to work on the task."
BAD_CALL = (
    "Your tool call could not be read. Write it as <tool_call><function=NAME><parameter=KEY>value</parameter>"
    '</function></tool_call> or <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.'
)
_REDUCE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "mean": lambda rewards: sum(rewards) / len(rewards),
    "max": max,
    "min": min,
}
_AGG = {"action_is_valid": "mean", "success": "last", "raw_reward": "last"}
T = TypeVar("T")


class OpenRewardConfig(BaseModel):
    """``env_config`` of ``openreward_env`` (ROLL's keys, same meanings)."""

    model_config = ConfigDict(extra="forbid")

    environment_name: str = Field(min_length=1, description="OpenReward environment, 'owner/name' (case-sensitive).")
    split: str = Field("train", min_length=1, description="The environment's task split to draw tasks from.")
    mode: Literal["train", "val"] = Field("train", description="ROLL's train/val label (kept in env_info).")
    max_steps: int = Field(16, ge=1, description="Turns per episode; the episode is truncated on the last.")
    system_prompt_template: str | None = Field(
        None, description="A system message; its '{tools}' becomes the tool schemas. None: no system message."
    )
    reward_reduction: Literal["sum", "mean", "max", "min"] = "sum"
    nonterminal_reward: float | None = Field(None, description="Added to the rewards when the episode is truncated.")
    retry_max_attempts: int = Field(3, ge=0, description="Retries of a session that fails to open.")
    retry_backoff_seconds: float = Field(5.0, ge=0, description="Wait before the first retry; doubled each retry.")

    @field_validator("system_prompt_template")
    @classmethod
    def _has_tools_placeholder(cls, template: str | None) -> str | None:
        if template is not None and "{tools}" not in template:
            raise ValueError("must contain the '{tools}' placeholder (where the tool schemas go)")
        return template

    def reduce(self, rewards: list[float], terminal: bool) -> float:
        """The episode's reward from the tools' rewards (``nonterminal_reward`` added when not ``terminal``)."""
        if not terminal and self.nonterminal_reward is not None:
            rewards = [*rewards, self.nonterminal_reward]
        return float(_REDUCE[self.reward_reduction](rewards)) if rewards else 0.0


def check_env_config(env_config: dict[str, Any]) -> OpenRewardConfig:
    """``env_config`` as settings, or one ConfigError naming each bad key."""
    return check_settings(OpenRewardConfig, env_config, "openreward_env", root="env_config")


def import_openreward() -> Any:
    """The ``openreward`` SDK, or MissingExtraError with the pip command that installs it."""
    return import_extra(
        "openreward",
        "openreward_env (OpenReward environments)",
        "roll-agentic",
        "openreward",
        note=f"with the mcp extra as well, which pip cannot install beside it: python -m {INSTALLER}",
    )


def openreward_api_key() -> str:
    """``$OPENREWARD_API_KEY``, or a ConfigError saying where to set it (a NotHereError: it is about this machine, a
    warning for ``roll validate --no-ray``)."""
    from roll.pipelines.validate import NotHereError

    key = os.environ.get(API_KEY_VAR, "").strip()
    if not key:
        raise NotHereError(
            f"openreward_env needs an OpenReward API key: export {API_KEY_VAR}=... (from https://openreward.ai/keys) "
            f"where the envs run: in the shell that starts `roll run`, or as system_envs.{API_KEY_VAR} (every role's "
            "and env manager's) for workers on other machines"
        )
    return key


def _http_status(error: BaseException) -> int | None:
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def _refused(error: BaseException) -> bool:
    """The server said no for good (bad key, unknown environment or task): retrying cannot help."""
    status = _http_status(error)
    return type(error).__name__ == "AuthenticationError" or (status is not None and 400 <= status < 500)


def _text_of(blocks: Any) -> str:
    """The text blocks of a prompt or tool output, joined; other blocks (images) are named, not dropped silently."""
    blocks = list(blocks or [])
    text = "".join(b.text for b in blocks if getattr(b, "type", "") == "text")
    others = [getattr(b, "type", type(b).__name__) for b in blocks if getattr(b, "type", "") != "text"]
    if others:
        text += f"\n[{len(others)} non-text block(s) not shown ({', '.join(sorted(set(others)))}): text-only env]"
    return text


def tool_schema(spec: Any) -> dict[str, Any]:
    """An OpenReward ``ToolSpec`` as the OpenAI function schema chat templates take."""
    parameters = spec.input_schema or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description or "", "parameters": parameters},
    }


class OpenRewardEnv:
    """One env slot: an episode is one OpenReward task in its own session (keys: see :class:`OpenRewardConfig`)."""

    seed_is_index = True  # the seed picks task seed % num_tasks: validation asks the tasks in order

    def __init__(self, **env_config: Any) -> None:
        self.config = check_env_config(env_config)
        sdk = import_openreward()
        self.client = sdk.OpenReward(api_key=openreward_api_key())
        self.session: Any = None
        self.messages: list[dict[str, Any]] = []
        self.rewards: list[float] = []
        self.tools: list[dict[str, Any]] = []
        self.task_index = -1
        self.turn = self.tool_calls = self.failed_calls = 0
        try:
            self.environment = self.client.environments.get(name=self.config.environment_name)
            self.num_tasks = int(
                self._retrying("counting its tasks", lambda: self.environment.num_tasks(self.config.split))
            )
        except BaseException:
            self.client.close()
            raise
        if self.num_tasks <= 0:
            self.client.close()
            raise ConfigError(f"env_config.split={self.config.split!r}: {self._name} has no tasks in that split")

    @classmethod
    def check_args(cls, **env_config: Any) -> str:
        """``roll validate``: the settings, the SDK and the API key (the service itself is not asked)."""
        config = check_env_config(env_config)
        import_openreward()
        openreward_api_key()
        return f"OpenReward environment {config.environment_name!r}, split {config.split!r}"

    @property
    def _name(self) -> str:
        return f"OpenReward environment {self.config.environment_name!r}"

    # --- episode ------------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        self.close_session()
        self.task_index = int(seed or 0) % self.num_tasks
        self.messages, self.rewards, self.tools = [], [], []
        self.turn = self.tool_calls = self.failed_calls = 0
        prompt = self._retrying(f"opening task {self._task}", self._open)
        if self.config.system_prompt_template is not None:
            listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools)
            self.messages.append(
                {"role": "system", "content": self.config.system_prompt_template.replace("{tools}", listed)}
            )
        self.messages.append({"role": "user", "content": prompt})
        info = {"tools": self.tools, "task_name": self._task, "failure_mode": "", "success": False}
        return list(self.messages), info

    def _open(self) -> str:
        """Open a session on the current task; its prompt (the tools land in ``self.tools``)."""
        session = self.environment.session(split=self.config.split, index=self.task_index)
        try:
            session.__enter__()
            self.session = session
            self.tools = [tool_schema(spec) for spec in session.list_tools()]
            return _text_of(session.get_prompt())
        except BaseException:
            # __enter__ can fail after the server made the session: __exit__ deletes what there is.
            self.session = None
            _exit_quietly(session)
            raise

    def step(self, action: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        if self.session is None:
            raise RuntimeError("step() without a running episode; call reset() first")
        self.turn += 1
        try:
            return self._step(action)
        except BaseException:
            self.close_session()
            raise

    def _step(self, action: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        reply = assistant_message(action)
        self.messages.append(reply.message)
        if not reply.tool_calls:
            if not reply.valid:
                self.failed_calls += 1
            self.messages.append({"role": "user", "content": NO_CALL if reply.valid else BAD_CALL})
            finished, failure = False, ""
        else:
            finished, failure = self._run_calls(reply.tool_calls)
        if failure:
            return self._end(reply.valid, terminal=False, failure_mode=failure)
        if finished:
            return self._end(reply.valid, terminal=True)
        if self.turn >= self.config.max_steps:
            return self._end(reply.valid, terminal=False)
        return self._answer(0.0, False, False, reply.valid)

    def _run_calls(self, calls: list[dict[str, Any]]) -> tuple[bool, str]:
        """Forward ``calls`` in order until one finishes the task; ``(finished, failure_mode)``."""
        import_openreward()
        from openreward.api.errors import HeartbeatTimeoutError, ToolCallError

        for call in calls:
            name = call["function"]["name"]
            self.tool_calls += 1
            try:
                output = self.session.call_tool(name, json.loads(call["function"]["arguments"]))
            except ToolCallError as e:  # the model's mistake (no such tool, arguments that do not fit): it is told
                self.failed_calls += 1
                self._tool_message(call, name, f"Error: tool {name!r} refused the call: {e}")
                continue
            except Exception as e:  # the SDK raises aiohttp, timeout and its own errors alike
                self.failed_calls += 1
                kind = (
                    "tool_call_timeout" if isinstance(e, TimeoutError | HeartbeatTimeoutError) else "tool_call_failed"
                )
                logger.warning(
                    "%s: call of %r in task %s failed: %s: %s", self._name, name, self._task, type(e).__name__, e
                )
                return False, f"{kind}: {name}: {type(e).__name__}: {e}"
            if output.reward is not None:
                self.rewards.append(float(output.reward))
            self._tool_message(call, name, _text_of(output.blocks))
            if output.finished:
                return True, ""
        return False, ""

    def _tool_message(self, call: dict[str, Any], name: str, content: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call.get("id", name), "name": name, "content": content})

    def _end(
        self, valid: bool, *, terminal: bool, failure_mode: str = ""
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        self.close_session()
        reward = self.config.reduce(self.rewards, terminal)
        return self._answer(reward, True, not terminal, valid, failure_mode)

    def _answer(
        self, reward: float, terminated: bool, truncated: bool, valid: bool, failure_mode: str = ""
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        success = any(r > 0 for r in self.rewards)  # ROLL: some tool gave a positive reward
        metrics = {
            "action_is_valid": float(valid),
            "success": float(success),
            "raw_reward": reward,
            "current_step": float(self.turn),
            "num_tool_calls": float(self.tool_calls),
            "num_failed_tool_calls": float(self.failed_calls),
            "task_id": float(self.task_index),
        }
        info = {
            "metrics": metrics,
            "metrics_agg_mode": _AGG,
            "action_is_valid": valid,
            "success": success,
            "failure_mode": failure_mode,
            "task_name": self._task,
        }
        return list(self.messages), reward, terminated, truncated, info

    @property
    def _task(self) -> str:
        return f"{self.config.environment_name}:{self.config.split}:{self.task_index}"

    @property
    def env_info(self) -> dict[str, Any]:
        """The episode's task, for trajectory logs (ROLL's keys)."""
        return {
            "environment_name": self.config.environment_name,
            "split": self.config.split,
            "mode": self.config.mode,
            "task_index": self.task_index,
            "current_step": self.turn,
            "num_tool_calls": self.tool_calls,
        }

    # --- retries and clean-up -----------------------------------------------------------------------------------
    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, retried ``retry_max_attempts`` times on transient errors (backoff doubling). A refusal (bad key,
        unknown environment or task) is a ConfigError at once; the last transient error a RuntimeError."""
        attempts = self.config.retry_max_attempts + 1
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                wait = self.config.retry_backoff_seconds * 2 ** (attempt - 1)
                logger.warning(
                    "%s: %s failed (%d/%d): %s; retrying in %gs", self._name, what, attempt, attempts, last, wait
                )
                time.sleep(wait)
            try:
                return call()
            except Exception as e:  # the SDK raises aiohttp, timeout and its own errors alike
                if _refused(e):
                    raise self._refusal(e) from e
                last = e
        raise RuntimeError(
            f"{self._name}: {what} failed {attempts} time(s); last error {type(last).__name__}: {last}"
        ) from last

    def _refusal(self, error: BaseException) -> ConfigError:
        status = _http_status(error)
        if status == 401 or type(error).__name__ == "AuthenticationError":
            # (the SDK's own message is a banner with terminal colours)
            return ConfigError(
                f"{self._name}: the server refused {API_KEY_VAR} (HTTP 401); check the key (https://openreward.ai/keys)"
            )
        lines = str(getattr(error, "message", "") or error).strip().splitlines()
        detail = lines[0] if lines else type(error).__name__
        if status == 404:
            return ConfigError(
                f"env_config.environment_name={self.config.environment_name!r}: the server knows no such environment "
                f"({detail}); names are 'owner/name', e.g. 'kanishk/EndlessTerminals'"
            )
        return ConfigError(f"{self._name} (split {self.config.split!r}) refused the request: HTTP {status}: {detail}")

    def close_session(self) -> None:
        """Close the episode's session (the server deletes it); nothing when none is open."""
        session, self.session = self.session, None
        if session is not None:
            _exit_quietly(session)

    def close(self) -> None:
        self.close_session()
        self.client.close()


def _exit_quietly(session: Any) -> None:
    try:
        session.__exit__(None, None, None)
    except Exception as e:  # closing is best effort: the server reaps sessions that stop pinging
        logger.debug("closing an OpenReward session failed: %s: %s", type(e).__name__, e)
