"""ToolEnvWrapper: tool turns vs env turns, counters, budget, rewards."""

from __future__ import annotations

import pytest

from roll.agentic.env import ArithmeticEnv
from roll.agentic.env.base import random_action_of
from roll.agentic.tools import (
    Tool,
    ToolEnvWrapper,
    ToolResult,
    ToolSpec,
    format_tool_call,
    make_tool,
    register_tool,
    tool_wrapper,
)
from roll.runtime import ConfigError


class Calculator(Tool):
    def specs(self):
        return [ToolSpec("calc", "Evaluate a+b.", {"type": "object", "properties": {"a": {}, "b": {}}})]

    def call(self, name, arguments):
        try:
            return ToolResult(True, str(int(arguments["a"]) + int(arguments["b"])))
        except (KeyError, ValueError) as e:
            return ToolResult(False, f"bad arguments: {e}")


def _env(**kwargs) -> ToolEnvWrapper:
    return ToolEnvWrapper(ArithmeticEnv(operators="+"), [Calculator()], **kwargs)


def test_tool_turns_count_calls_and_successes() -> None:
    env = _env(tool_reward=0.01, tool_success_reward=0.1)
    question, info = env.reset(seed=3)
    assert "calc" in question and info["metrics"]["tool_use_counter"] == 0 and info["use_tool"] is False
    observation, reward, terminated, _, info = env.step(format_tool_call("calc", {"a": 2, "b": 3}))
    assert observation == "calc result:\n5" and reward == 0.11 and not terminated and info["use_tool"]
    observation, reward, *_, info = env.step(format_tool_call("calc", {"a": "x"}) + '<tool_call>{"bad"</tool_call>')
    assert info["metrics"] == {"tool_use_counter": 3, "tool_success_counter": 1}
    assert "Tool call failed" in observation and "calc failed" in observation and reward == 0.02
    answer = env.env.answer
    observation, reward, terminated, _truncated, info = env.step(f"<answer>{answer}</answer>")
    assert terminated and reward == 1.0 and info["use_tool"] is False and info["metrics"]["tool_use_counter"] == 3
    env.reset(seed=4)
    assert env.tool_use_counter == 0


def test_tool_turns_keep_the_wrapped_envs_metric_modes() -> None:
    """The manager aggregates an episode's metrics with the modes of its last info: one that ended on a tool turn
    (max_steps while still calling tools) lost the env's modes, and its "sum" metrics were averaged."""

    class Penalized(ArithmeticEnv):
        def step(self, action):
            observation, reward, terminated, truncated, info = super().step(action)
            info.update(metrics={"penalty": 1.0}, metrics_agg_mode={"penalty": "sum"})
            return observation, reward, terminated, truncated, info

    env = ToolEnvWrapper(Penalized(operators="+", max_steps=5), [Calculator()])
    env.reset(seed=0)
    env.step("no answer")
    *_, info = env.step(format_tool_call("calc", {"a": 1, "b": 2}))
    assert info["use_tool"] and info["metrics_agg_mode"] == {
        "penalty": "sum",
        "tool_use_counter": "last",
        "tool_success_counter": "last",
    }


def test_budget_sends_further_calls_to_the_env() -> None:
    env = _env(max_tool_uses=1)
    env.reset(seed=0)
    env.step(format_tool_call("calc", {"a": 1, "b": 1}))
    _observation, _reward, _terminated, _truncated, info = env.step(format_tool_call("calc", {"a": 1, "b": 1}))
    # The env saw the call as an answerless response: format penalty path, not a tool run.
    assert info["use_tool"] is False and info["action_is_valid"] is False and info["metrics"]["tool_use_counter"] == 1


def test_calls_run_in_the_order_written_and_every_block_spends_the_budget() -> None:
    """A malformed block between two calls: the results follow the blocks' order, and the budget of 2 ends the
    turn before the third block (errors were reported first, and spent no budget check)."""
    env = _env(max_tool_uses=2)
    env.reset(seed=0)
    action = (
        format_tool_call("calc", {"a": 1, "b": 1})
        + '<tool_call>{"bad"</tool_call>'
        + format_tool_call("calc", {"a": 2, "b": 2})
    )
    observation, *_, info = env.step(action)
    lines = observation.split("\n")
    assert lines[:2] == ["calc result:", "2"] and lines[2].startswith("Tool call failed")
    assert lines[3] == "Tool budget used up: give your final answer." and len(lines) == 4
    assert info["metrics"] == {"tool_use_counter": 2, "tool_success_counter": 1}
    # one result per block run, the closing notice on the last (a chat proxy answers each call on its own)
    assert info["tool_outputs"] == ["calc result:\n2", lines[2] + "\n" + lines[3]]


def test_unknown_tool_is_a_failed_call() -> None:
    env = _env()
    env.reset(seed=0)
    observation, *_, info = env.step(format_tool_call("nope", {}))
    assert "unknown tool 'nope'" in observation and info["metrics"] == {
        "tool_use_counter": 1,
        "tool_success_counter": 0,
    }


def test_tool_instruction_replaces_the_generated_description() -> None:
    class Adder(Calculator):
        def specs(self):
            return [ToolSpec("add", "Add a and b.")]

    silent, custom = Calculator(), Adder()
    silent.tool_instruction = ""
    question, _ = ToolEnvWrapper(ArithmeticEnv(operators="+"), [silent]).reset(seed=3)
    assert question == ArithmeticEnv(operators="+").reset(seed=3)[0]  # the question alone
    custom.tool_instruction = "add adds two numbers."
    question, _ = ToolEnvWrapper(ArithmeticEnv(operators="+"), [Calculator(), custom]).reset(seed=3)
    generated, own = question.split("\n", 1)[1].rsplit("\n", 1)
    assert generated.startswith("You may call tools.") and generated.count('"name": "calc"') == 1
    assert own == "add adds two numbers." and '"add"' not in generated
    tool = make_tool("python_code", tool_instruction="python_code(code) runs Python.", timeout_s=2.0)
    assert tool.tool_instruction == "python_code(code) runs Python." and tool.timeout_s == 2.0


def test_tool_instruction_must_be_text() -> None:
    with pytest.raises(ConfigError, match="tool_instruction must be a string"):
        make_tool("python_code", tool_instruction=["no"])


class ClosingCalculator(Calculator):
    closed: list[str] = []

    def close(self) -> None:
        ClosingCalculator.closed.append("calc")


def test_a_wrapper_that_cannot_be_built_closes_the_tools_it_made() -> None:
    """Two tools offering `calc`: the ConfigError comes after both were built; both are closed (an MCP server's
    process used to outlive the error)."""
    register_tool("closing_calc_test", f"{__name__}:ClosingCalculator")
    ClosingCalculator.closed.clear()
    configs = [{"tool_id": "closing_calc_test"}, {"tool_id": "closing_calc_test"}]
    with pytest.raises(ConfigError, match="two tools offer a function named 'calc'"):
        tool_wrapper(ArithmeticEnv(), {}, configs)
    assert ClosingCalculator.closed == ["calc", "calc"]
    ClosingCalculator.closed.clear()
    with pytest.raises(ConfigError, match=r"tool_configs\[1\] needs 'tool_id'"):
        tool_wrapper(ArithmeticEnv(), {}, [{"tool_id": "closing_calc_test"}, {"tool": "x"}])
    assert ClosingCalculator.closed == ["calc"]


def test_a_tool_that_fails_to_close_leaves_the_others_closed() -> None:
    # the first close that raised left the later tools (an MCP server's process) and the env open
    class Broken(Calculator):
        def specs(self):
            return [ToolSpec("broken", "Fails to close.")]

        def close(self) -> None:
            raise RuntimeError("socket already gone")

    class Env(ArithmeticEnv):
        closed = False

        def close(self) -> None:
            Env.closed = True

    ClosingCalculator.closed = []
    wrapper = ToolEnvWrapper(Env(), [Broken(), ClosingCalculator()])
    with pytest.raises(RuntimeError, match="socket already gone"):
        wrapper.close()
    assert ClosingCalculator.closed == ["calc"] and Env.closed


def test_misspelled_wrapper_args_are_named() -> None:
    from roll.agentic.config import ToolWrapperConfig

    with pytest.raises(ConfigError, match=r"wrapper_args: unknown keys \['tool_rewrd'\]; accepted: \['tool_reward'"):
        tool_wrapper(ArithmeticEnv(), {"tool_rewrd": 1.0}, [])
    with pytest.raises(ValueError, match=r"unknown keys \['tool_rewrd'\]; accepted: \['tool_reward'"):
        ToolWrapperConfig(wrapper_args={"tool_rewrd": 1.0})
    assert ToolWrapperConfig(wrapper_args={"tool_reward": 0.1}).wrapper_args == {"tool_reward": 0.1}


class NoRandomEnv:
    def reset(self, seed=None):
        return "start", {}

    def step(self, action):
        return "done", 1.0, True, False, {}


class UnseededRandomEnv(NoRandomEnv):
    """GEM's signature: sample_random_action() takes no seed."""

    def sample_random_action(self):
        return "<answer>7</answer>"


def test_a_random_action_is_the_wrapped_envs_answer_and_never_a_tool_call() -> None:
    env = _env()
    draws = [env.sample_random_action(seed=s) for s in range(10)]
    assert draws == [ArithmeticEnv(operators="+").sample_random_action(seed=s) for s in range(10)]
    assert random_action_of(env)(3) == draws[3]
    env.reset(seed=1)
    *_, info = env.step(draws[0])
    assert info["use_tool"] is False and info["action_is_valid"] is True and info["metrics"]["tool_use_counter"] == 0
    # a wrapped env that takes no seed is asked bare; one without random actions leaves the wrapper without them
    assert ToolEnvWrapper(UnseededRandomEnv(), [Calculator()]).sample_random_action(seed=5) == "<answer>7</answer>"
    wrapped = ToolEnvWrapper(NoRandomEnv(), [Calculator()])
    assert wrapped.sample_random_action is None and random_action_of(wrapped) is None
