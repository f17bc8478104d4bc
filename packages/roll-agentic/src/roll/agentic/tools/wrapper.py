"""ToolEnvWrapper: give any environment tools, and count how often they are called and succeed.

On reset the tools' instruction (a generated description of their functions, or each tool's own
``tool_instruction``) is appended to the first observation. On each step a response holding tool calls is
answered by the tools (the episode goes on; the observation is the results, and ``info["use_tool"]`` is True, so the
env manager renders it as a ``tool`` message); any other response goes to the wrapped environment. ``tool_format``
picks how calls are written and results worded (:mod:`roll.agentic.tools.formats`): ``hermes`` (default, Hermes/Qwen
``<tool_call>`` JSON, every block runs) or ``gem`` (GEM's tags, ``<python>``/``<search>``/..., one call per turn).
A tool turn's ``info["tool_outputs"]`` lists each call's own result (the observation joins them), and
:meth:`ToolEnvWrapper.chat_tools` gives the tools' schemas and a writer of structured calls in ``tool_format``, for a
hosted chat model (``llm_proxy`` openai, ``api: chat``) that calls tools natively.
``info["metrics"]`` carries ``tool_use_counter`` and ``tool_success_counter`` (calls and successful calls so far in
the episode); ``tool_reward``/``tool_success_reward`` optionally reward calls.

A random action (``llm_proxy.proxy_type: random``) of a wrapped env is the wrapped env's own: its answer, never a tool
call, so a random baseline reads the chance score of the task itself. A wrapped env without one leaves the wrapper
without one too, and ``random`` refuses the tag.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roll.agentic.env.base import (
    Env,
    EnvLike,
    ResetOutput,
    StepOutput,
    check_reset_output,
    check_step_output,
    random_action_of,
)
from roll.agentic.tools.base import Tool, ToolResult
from roll.agentic.tools.formats import action_format
from roll.agentic.tools.registry import make_tool
from roll.runtime import ConfigError

if TYPE_CHECKING:
    from roll.agentic.policy.protocol import ChatTools

__all__ = ["WRAPPER_ARGS", "ToolEnvWrapper", "tool_wrapper"]

WRAPPER_ARGS = ("tool_reward", "tool_success_reward", "max_tool_uses", "tool_format")
"""The keys of ``tool_wrapper.wrapper_args`` (the wrapper's keyword arguments): ROLL's three and roll's
``tool_format``."""


class ToolEnvWrapper(Env):
    """Wraps ``env`` with ``tools``; at most ``max_tool_uses`` calls per episode are executed."""

    def __init__(
        self,
        env: EnvLike,
        tools: list[Tool],
        tool_reward: float = 0.0,
        tool_success_reward: float = 0.0,
        max_tool_uses: int | None = 10,
        tool_format: str = "hermes",
    ) -> None:
        self.env, self.tools = env, tools
        self.tool_reward, self.tool_success_reward = tool_reward, tool_success_reward
        self.max_tool_uses = max_tool_uses
        self._by_name: dict[str, Tool] = {}
        for tool in tools:
            for spec in tool.specs():
                if spec.name in self._by_name:
                    raise ConfigError(f"two tools offer a function named {spec.name!r}; tool names must be unique")
                self._by_name[spec.name] = tool
        self.format = action_format(tool_format, tools)
        for tool in tools:
            tool.action_format = tool_format
        self.uses_global_rng = bool(getattr(env, "uses_global_rng", False))
        self.tool_use_counter = 0
        self.tool_success_counter = 0
        self._chat_tools: ChatTools | None = None
        self._env_modes: dict[str, str] = {}

    def chat_tools(self) -> ChatTools:
        """The tools as a chat endpoint takes them (``llm_proxy`` openai, ``api: chat``): every function's schema,
        and a structured call written in this wrapper's ``tool_format``, as :meth:`step` reads it (built on the
        first call: the tools do not change)."""
        if self._chat_tools is None:
            from roll.agentic.policy.protocol import ChatTools  # the policy package imports tools: not at import time

            schemas = [spec.as_json() for tool in self.tools for spec in tool.specs()]
            self._chat_tools = ChatTools(schemas, self.format.write)
        return self._chat_tools

    def instruction(self) -> str:
        """The generated description of the tools without a ``tool_instruction``, then the others' own texts."""
        return self.format.instruction()

    def _metrics(self, info: dict[str, Any]) -> dict[str, Any]:
        metrics = dict(info.get("metrics") or {})
        metrics.update(tool_use_counter=self.tool_use_counter, tool_success_counter=self.tool_success_counter)
        info["metrics"] = metrics
        # The env's own modes are kept for tool turns too: the manager reads the episode's modes from its last info,
        # and an episode that ended on a tool turn (max_steps) averaged the env's "sum"/"last" metrics.
        self._env_modes.update(info.get("metrics_agg_mode") or {})
        # The counters are running totals: an episode's value is the last one, not the mean over turns.
        modes = dict(self._env_modes)
        modes.update(tool_use_counter="last", tool_success_counter="last")
        info["metrics_agg_mode"] = modes
        return info

    def reset(self, seed: int | None = None) -> ResetOutput:
        self.tool_use_counter = self.tool_success_counter = 0
        self._env_modes = {}
        observation, info = check_reset_output(self.env.reset(seed=seed))
        info["use_tool"] = False
        instruction = self.instruction()
        return f"{observation}\n{instruction}" if instruction else observation, self._metrics(info)

    @property
    def sample_random_action(self) -> Callable[..., str] | None:
        """The wrapped env's random action, seeded with the turn's seed where the wrapped env takes one; None when
        the wrapped env has none (so the wrapper has none either)."""
        sample = random_action_of(self.env)
        if sample is None:
            return None

        def sample_random_action(seed: int | None = None) -> str:
            return sample(seed)

        return sample_random_action

    def _run(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self._by_name.get(name)
        if tool is None:
            return ToolResult(False, f"unknown tool {name!r}; available: {sorted(self._by_name)}")
        return tool.call(name, arguments)

    def step(self, action: str) -> StepOutput:
        parsed = self.format.parse(action)
        budget_left = self.max_tool_uses is None or self.tool_use_counter < self.max_tool_uses
        if not parsed.present or not budget_left:
            observation, reward, terminated, truncated, info = check_step_output(self.env.step(action))
            info["use_tool"] = False
            return observation, reward, terminated, truncated, self._metrics(info)
        outputs, reward, cut_short = [], 0.0, False
        for call in parsed.blocks:  # in the order written; an unreadable block is a failed use of the budget
            if self.max_tool_uses is not None and self.tool_use_counter >= self.max_tool_uses:
                cut_short = True
                break
            self.tool_use_counter += 1
            reward += self.tool_reward
            if isinstance(call, str):
                outputs.append(self.format.result(None, call, None))
                continue
            result = self._run(call.name, call.arguments)
            if result.ok:
                self.tool_success_counter += 1
                reward += self.tool_success_reward
            outputs.append(self.format.result(self._by_name.get(call.name), call, result))
        used_up = self.max_tool_uses is not None and self.tool_use_counter >= self.max_tool_uses
        closing = self.format.closing(cut_short, used_up)
        observation = "\n".join(outputs) + closing
        # one result per call run, the closing notice on the last: a chat proxy answers each call on its own
        tool_info: dict[str, Any] = {
            "use_tool": True,
            "success": False,
            "tool_outputs": [*outputs[:-1], outputs[-1] + closing],
        }
        return observation, reward, False, False, self._metrics(tool_info)

    def close(self) -> None:
        """Close every tool and the wrapped env, each even when one before it fails (an MCP server's process must not
        outlive a tool whose close raised); the first failure is raised after."""
        closers = [tool.close for tool in self.tools]
        close = getattr(self.env, "close", None)
        if callable(close):
            closers.append(close)
        failure: BaseException | None = None
        for closer in closers:
            try:
                closer()
            except Exception as e:
                failure = failure or e
        if failure is not None:
            raise failure


def tool_wrapper(env: EnvLike, wrapper_args: dict[str, Any], tool_configs: list[dict[str, Any]]) -> ToolEnvWrapper:
    """Build the wrapper from ROLL's ``tool_wrapper`` config: ``tool_configs: [{tool_id, tool_args}]``."""
    unknown_args = sorted(set(wrapper_args) - set(WRAPPER_ARGS))
    if unknown_args:
        raise ConfigError(f"tool_wrapper.wrapper_args: unknown keys {unknown_args}; accepted: {list(WRAPPER_ARGS)}")
    tools: list[Tool] = []
    try:
        for i, config in enumerate(tool_configs):
            unknown = sorted(set(config) - {"tool_id", "tool_args"})
            if "tool_id" not in config or unknown:
                raise ConfigError(
                    f"tool_configs[{i}] needs 'tool_id' (and optional 'tool_args'); unknown keys {unknown}"
                )
            tools.append(make_tool(config["tool_id"], **(config.get("tool_args") or {})))
        return ToolEnvWrapper(env, tools, **wrapper_args)
    except BaseException:
        for tool in tools:  # the ones already built (an MCP server's process and thread) do not outlive the error
            with contextlib.suppress(Exception):  # nor does one failing to close hide the error or the others
                tool.close()
        raise
