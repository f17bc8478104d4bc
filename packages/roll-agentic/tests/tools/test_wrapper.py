"""ToolEnvWrapper: tool turns vs env turns, counters, budget, rewards."""

from __future__ import annotations

from roll.agentic.env import ArithmeticEnv
from roll.agentic.tools import Tool, ToolEnvWrapper, ToolResult, ToolSpec, format_tool_call


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


def test_budget_sends_further_calls_to_the_env() -> None:
    env = _env(max_tool_uses=1)
    env.reset(seed=0)
    env.step(format_tool_call("calc", {"a": 1, "b": 1}))
    _observation, _reward, _terminated, _truncated, info = env.step(format_tool_call("calc", {"a": 1, "b": 1}))
    # The env saw the call as an answerless response: format penalty path, not a tool run.
    assert info["use_tool"] is False and info["action_is_valid"] is False and info["metrics"]["tool_use_counter"] == 1


def test_unknown_tool_is_a_failed_call() -> None:
    env = _env()
    env.reset(seed=0)
    observation, *_, info = env.step(format_tool_call("nope", {}))
    assert "unknown tool 'nope'" in observation and info["metrics"] == {
        "tool_use_counter": 1,
        "tool_success_counter": 0,
    }
