"""ROLL's ``rock_tb_native_env``: SWE-bench / terminal-bench tasks played by an agent in a ROCK sandbox.

Per episode (``reset(seed)``): a task is drawn from ``dataset_name``; a sandbox is started from the task's image,
ROCK's agent is installed in it (``agent_config``) and started on the task's prompt (``run_cmd``, ROLL's
``<<PROMPT>>`` placeholder); the agent's first LLM request, caught by ROCK's model service, is the observation: its
``messages`` (the agent's own system prompt, task, tool results...) and, in the reset ``info["tools"]``, its tool
schemas. Each ``step(reply)`` hands the policy's reply to the agent as the LLM's answer (tool calls read as ROLL's
Qwen3-Coder parser does, :func:`~roll.agentic.env.tool_calls.assistant_message`); the agent runs its tools in the
sandbox and its next request is the next observation. When the agent ends its session (``SESSION_END``), the turn
limit ``max_steps`` is reached, or the episode has run ``max_env_time`` seconds, the task's tests run in the sandbox
and their verdict is the reward (1 resolved, 0 not), given on that last turn. With ``max_multi_session_num`` > 1 an
ended session is followed by a new one whose prompt is the test output. The sandbox is stopped when the episode
ends, when a call raises (the runner then fails the episode: ``env_error``), and on ``close()`` (the runner closes
an env that timed out); ``debug: true`` leaves it to ROCK's ``auto_clear_seconds``.

Played by the ``agent_native`` manager (ROLL's ``AgentNativeStepEnvManager``). Follows ROLL's
``roll/pipeline/agentic/env/sandbox/rock_tb_native_env.py`` and ``env/rock/sandbox_manager_v2.py``; differences:
tasks are read per env from the file (see :class:`~roll.agentic.env.rock.config.TaskSet`), ``max_env_time`` is
measured (ROLL never advances its clock), a sandbox that cannot start fails the episode (ROLL retries three times,
sleeping minutes), and a missing test folder gives reward 0 with ``failure_mode`` instead of an exception.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from roll.agentic.env.rock.config import RockEnvConfig, TaskSet
from roll.agentic.env.rock.sandbox import SandboxClient
from roll.agentic.env.rock.tests_run import run_solution, run_task_tests
from roll.agentic.env.tool_calls import assistant_message
from roll.runtime import import_target
from roll.runtime.config import check_settings

__all__ = ["SESSION_END", "RockTBNativeEnv", "check_env_config"]

SESSION_END = "SESSION_END"
_AGG = {"action_is_valid": "mean", "success": "last", "raw_reward": "last"}


def check_env_config(env_config: dict[str, Any]) -> RockEnvConfig:
    """``env_config`` as settings, or one ConfigError naming each bad key."""
    return check_settings(RockEnvConfig, env_config, "rock_tb_native_env", root="env_config")


class RockTBNativeEnv:
    """One env slot: an episode is one task in one fresh sandbox (keys: see RockEnvConfig)."""

    def __init__(self, **env_config: Any) -> None:
        self.config = check_env_config(env_config)
        self.tasks = TaskSet(self.config)
        target = self.config.sandbox_cls
        self.sandbox_cls = import_target(target, "env_config.sandbox_cls") if isinstance(target, str) else target
        self.sandbox: SandboxClient | None = None
        self.messages: list[dict[str, Any]] = []
        self.task: dict[str, Any] = {}
        self._clear()

    def _clear(self) -> None:
        self.turn = self.session_turn = self.sessions = 0
        self.reward, self.failure_mode, self.test_output = 0.0, "", ""
        self.started = time.monotonic()
        self.ended = False
        self.tools: list[dict[str, Any]] = []

    # --- episode ------------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        self.close()
        self._clear()
        self.task = self.tasks.pick(int(seed or 0))
        c = self.config
        self.image = str(self.task[c.sandbox_image_key])
        self.task_name = str(self.task[c.task_name_key])
        # ROLL: SWE-bench images keep the repository in /testbed, terminal-bench ones in /app.
        self.project_path = "/testbed" if "swebench" in self.image else "/app"
        try:
            self.sandbox = self.sandbox_cls(self.image, self._episode_config())
            self.sandbox.start()
            self.sandbox.install_agent()
            self._start_script()
            self._start_session(str(self.task[c.question_key]))
            if self.ended:
                raise RuntimeError(f"the agent's first LLM request did not come: {self.failure_mode}")
        except BaseException:
            self.close()
            raise
        info = {"tools": self.tools, "task_name": self.task_name, "failure_mode": self.failure_mode, "success": False}
        return list(self.messages), info

    def step(self, action: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        if self.sandbox is None or self.ended:
            raise RuntimeError("step() without a running episode; call reset() first")
        self.turn += 1
        self.session_turn += 1
        try:
            return self._step(action)
        except BaseException:
            self.close()
            raise

    def _step(self, action: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        reply = assistant_message(action)
        self.messages = [*self.messages, reply.message]
        timed_out = time.monotonic() - self.started > self.config.max_env_time
        if timed_out or self.config.exp_mode == "eval_gt":
            if timed_out:
                self.failure_mode = "env_timeout"
            else:
                self.failure_mode = run_solution(self._box(), *self._test_args(self.config.agent_timeout_sec))
            self._run_tests()
            self._end_episode()
            return self._answer(True, True, reply.valid, env_timeout=timed_out)
        request = self._relay(reply.message)
        step_limit = self.turn >= self.config.max_steps
        if request == SESSION_END or step_limit:
            self._run_tests()
            if not step_limit and self.sessions < self.config.max_multi_session_num:
                self._start_session(self.test_output)
                if not self.ended:
                    return self._answer(False, False, reply.valid)
            self._end_episode()
            return self._answer(True, step_limit and request != SESSION_END, reply.valid)
        self._read_request(request)
        return self._answer(self.ended, False, reply.valid)

    def _answer(
        self, terminated: bool, truncated: bool, valid: bool, env_timeout: bool = False
    ) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        reward = self.reward if terminated else 0.0
        metrics = {
            "env_timeout": float(env_timeout),
            "action_is_valid": float(valid),
            "success": float(reward > 0),
            "raw_reward": reward,
            "current_step": float(self.turn),
            "task_id": float(self.task[self.config.id_key]),
        }
        info = {
            "metrics": metrics,
            "metrics_agg_mode": _AGG,
            "action_is_valid": valid,
            "success": reward > 0,
            "failure_mode": self.failure_mode,
            "test_output": self.test_output,
            "task_name": self.task_name,
            "tag": self.task.get(self.config.tag_key, ""),
        }
        return list(self.messages), reward, terminated, truncated, info

    # --- agent sessions -----------------------------------------------------------------------------------------
    def _box(self) -> SandboxClient:
        if self.sandbox is None:
            raise RuntimeError("no sandbox")
        return self.sandbox

    def _start_session(self, prompt: str) -> None:
        """Start the agent on ``prompt``; its first LLM request becomes the observation."""
        self.sessions += 1
        self.session_turn = 0
        self._box().start_agent(prompt)
        request = self._relay(None)
        if request == SESSION_END and self.sessions > 1:
            self._end_episode()  # the agent asks nothing more (or its relay failed): the last tests' verdict stands
            return
        self._read_request(request)

    def _relay(self, message: dict[str, Any] | None) -> str:
        """Hand the policy's reply to the agent (none: fetch its first request); its next request, or SESSION_END."""
        payload = None
        if message is not None:
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            payload = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        try:
            output = self._box().anti_call(self.session_turn, payload)
        except Exception as e:
            # ROLL: a failed relay ends the agent's session (the tests still run).
            self.failure_mode = f"model_service_anti_call_llm_failed: {type(e).__name__}: {e}"
            return SESSION_END
        lines = output.strip().splitlines()
        return lines[-1].strip() if lines else ""

    def _read_request(self, request: str) -> None:
        """The agent's LLM request -> messages and tools; an unreadable one ends the episode (reward 0)."""
        try:
            data = json.loads(request)
            messages, tools = data["messages"], data.get("tools") or []
            if not isinstance(messages, list) or not messages or not isinstance(tools, list):
                raise ValueError("'messages' must be a non-empty list and 'tools' a list")
        except (ValueError, KeyError, TypeError) as e:
            self.failure_mode = f"model_service_anti_call_llm_failed: unreadable agent request ({e}): {request:.200}"
            self.reward = 0.0
            self._end_episode()
            return
        self.messages = messages
        if self.sessions == 1 and self.session_turn == 0:
            self.tools = tools

    def _start_script(self) -> None:
        """The task's start script, run in the background (ROLL only warns when it fails)."""
        script = str(self.task.get(self.config.start_script_key) or "")
        if not script:
            return
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "start.sh"
            local.write_text(script, encoding="utf-8")
            self._box().upload(str(local), "/tmp/roll_start.sh")
        self._box().run("nohup bash /tmp/roll_start.sh > /tmp/roll_start.log 2>&1 &", self.config.timeout)

    # --- reward and clean-up ------------------------------------------------------------------------------------
    def _test_args(self, timeout: float) -> tuple[list[str], str, str, float]:
        return self.config.test_files, self.task_name, self.project_path, timeout

    def _run_tests(self) -> None:
        result = run_task_tests(self._box(), *self._test_args(self.config.test_timeout_sec))
        self.reward = 1.0 if result.resolved else 0.0
        self.test_output = result.output
        if result.failure:
            self.failure_mode = result.failure

    def _end_episode(self) -> None:
        self.ended = True
        self.close()

    def _episode_config(self) -> RockEnvConfig:
        agent = {**self.config.agent_config, "project_path": self.project_path}
        return self.config.model_copy(update={"agent_config": agent})

    def close(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None and not self.config.debug:
            sandbox.stop()
