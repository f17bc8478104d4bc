"""tool_format: gem: GEM's tags read, one call per turn, results worded as GEM's tools word them; counters, budget
and rewards as under hermes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from roll.agentic.config import ToolWrapperConfig
from roll.agentic.env import ArithmeticEnv
from roll.agentic.tools import Tool, ToolCall, ToolEnvWrapper, ToolResult, ToolSpec, action_format, make_tool
from roll.agentic.tools import tool_wrapper as build_wrapper
from roll.agentic.tools.search import SearchTool
from roll.runtime import ConfigError

DOCS = [
    {"id": "ray", "title": "Ray", "text": "Ray runs distributed Python actors."},
    {"id": "torch", "title": "PyTorch", "text": "PyTorch is a tensor library."},
]


class Calculator(Tool):
    def specs(self):
        return [ToolSpec("calc", "Add a and b.", {"type": "object", "properties": {"a": {}, "b": {}}})]

    def call(self, name, arguments):
        try:
            return ToolResult(True, str(int(arguments["a"]) + int(arguments["b"])))
        except (KeyError, ValueError) as e:
            return ToolResult(False, f"bad arguments: {e}")


def _python_calls(text: str) -> list:
    return action_format("gem", [make_tool("python_code")]).parse(text).blocks


def test_python_blocks_in_each_form_and_the_one_that_ends_first_runs() -> None:
    assert _python_calls("x <python>\nprint(1)\n</python>") == [ToolCall("python_code", {"code": "print(1)"})]
    assert _python_calls("<code>print(2)</code>") == [ToolCall("python_code", {"code": "print(2)"})]
    assert _python_calls("```python\nprint(3)\n```") == [ToolCall("python_code", {"code": "print(3)"})]
    # several blocks: one call, the complete block that ends first (a fenced block inside an unclosed tag wins)
    two = "<python>print('a')</python> then <python>print('b')</python>"
    assert _python_calls(two) == [ToolCall("python_code", {"code": "print('a')"})]
    assert _python_calls("<python>\n```python\nprint(4)\n```\n") == [ToolCall("python_code", {"code": "print(4)"})]
    # cut off at the token limit inside a block, or roll's <tool_call> form: not a call
    assert _python_calls("<python>print(5)") == [] and _python_calls("```python\nprint(6)") == []
    assert _python_calls('<tool_call>{"name": "python_code", "arguments": {"code": "1"}}</tool_call>') == []


def test_search_and_function_forms(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS))
    gem = action_format("gem", [SearchTool(corpus_path=str(corpus)), Calculator()])
    assert gem.parse("<search> ray actors </search><search>b</search>").blocks == [
        ToolCall("search", {"query": "ray actors"})
    ]
    assert gem.parse("<search>unterminated").blocks == []
    xml = '<tool_call>\n<tool_name>calc</tool_name>\n<arguments>\n{"a": 1, "b": 2}\n</arguments>\n</tool_call>'
    roll_mcp = '<tool_call>{"tool_name": "calc", "tool_params": {"a": 1, "b": 2}}</tool_call>'
    hermes = '<tool_call>{"name": "calc", "arguments": {"a": 1, "b": 2}}</tool_call>'
    for text in (xml, roll_mcp, hermes):
        assert gem.parse(text).blocks == [ToolCall("calc", {"a": 1, "b": 2})]
    (error,) = gem.parse("<tool_call><tool_name>calc</tool_name><arguments>{oops</arguments></tool_call>").blocks
    assert isinstance(error, str) and "not valid JSON" in error
    # tools are asked in config order: the search tool's block runs even when a function call comes first
    assert gem.parse(f"{xml}<search>q</search>").blocks == [ToolCall("search", {"query": "q"})]
    instruction = gem.instruction()
    assert (
        instruction.startswith("Available tools:\n") and "<search>" in instruction and '"name": "calc"' in instruction
    )


def test_a_stray_opening_tag_does_not_hide_the_complete_function_call() -> None:
    # the tag mentioned before the call made the first complete-looking block start there: an unreadable call
    gem = action_format("gem", [Calculator()])
    xml = '<tool_call><tool_name>calc</tool_name><arguments>{"a": 1, "b": 2}</arguments></tool_call>'
    assert gem.parse(f"I write a <tool_call> block: {xml}").blocks == [ToolCall("calc", {"a": 1, "b": 2})]


def test_a_structured_call_is_written_as_the_format_reads_it(tmp_path: Path) -> None:
    """A hosted chat model's tool_calls (llm_proxy openai, api: chat) come back as the call the wrapper runs."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS))
    tools = [make_tool("python_code"), SearchTool(corpus_path=str(corpus)), Calculator()]
    gem, hermes = action_format("gem", tools), action_format("hermes", tools)
    for name, arguments in [("python_code", {"code": "print(2)"}), ("search", {"query": "ray"}), ("calc", {"a": 1})]:
        assert gem.parse(gem.write(name, arguments)).blocks == [ToolCall(name, arguments)]
        assert hermes.parse(hermes.write(name, arguments)).blocks == [ToolCall(name, arguments)]
    assert gem.write("python_code", {"code": "print(2)"}) == "<python>print(2)</python>"
    assert gem.write("search", "ray") == "<search>ray</search>"  # a bare string is the one argument
    # arguments that are not a JSON object reach the wrapper as written, and read as a failed call
    (error,) = gem.parse(gem.write("calc", "{oops")).blocks
    assert isinstance(error, str) and "not valid JSON" in error
    (error,) = hermes.parse(hermes.write("calc", "{oops")).blocks
    assert isinstance(error, str) and "calc" in error


def test_python_episode_in_gem_format() -> None:
    env = ToolEnvWrapper(
        ArithmeticEnv(operators="+"),
        [make_tool("python_code")],
        tool_reward=0.01,
        tool_success_reward=0.1,
        max_tool_uses=2,
        tool_format="gem",
    )
    question, info = env.reset(seed=0)
    assert "<python>...</python>" in question and "<tool_call>" not in question and not info["use_tool"]
    observation, reward, terminated, _, info = env.step("<python>print(6 * 7)</python><python>print(0)</python>")
    assert observation == "Code execution result: 42\n\n" and reward == pytest.approx(0.11) and not terminated
    assert info["use_tool"] and info["metrics"] == {"tool_use_counter": 1, "tool_success_counter": 1}
    observation, reward, *_, info = env.step("```python\nraise ValueError('no')\n```")
    assert observation == (
        "Code execution result: Error: ValueError: no\n\n\nThat was your last tool call: give your final answer now."
    )
    assert reward == pytest.approx(0.01) and info["metrics"] == {"tool_use_counter": 2, "tool_success_counter": 1}
    # the budget is used up: a further block goes to the env, which applies its format penalty path
    _observation, reward, terminated, _, info = env.step("<python>print(1)</python>")
    assert not info["use_tool"] and info["action_is_valid"] is False and reward == 0.0 and not terminated
    _observation, reward, terminated, _, info = env.step(f"<answer>{env.env.answer}</answer>")
    assert terminated and reward == 1.0 and info["metrics"]["tool_use_counter"] == 2


def test_unterminated_block_at_the_token_limit_goes_to_the_env() -> None:
    env = ToolEnvWrapper(ArithmeticEnv(operators="+"), [make_tool("python_code")], tool_format="gem")
    env.reset(seed=1)
    _observation, _reward, _terminated, _, info = env.step("<python>print(1 +")
    assert not info["use_tool"] and info["action_is_valid"] is False
    assert info["metrics"] == {"tool_use_counter": 0, "tool_success_counter": 0}


def test_search_episode_in_gem_format(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in DOCS))
    tool_configs = [{"tool_id": "search", "tool_args": {"corpus_path": str(corpus), "top_k": 2}}]
    env = build_wrapper(ArithmeticEnv(), {"tool_format": "gem", "tool_success_reward": 0.5}, tool_configs)
    question, _ = env.reset(seed=0)
    assert "<search> your query </search>" in question
    observation, reward, terminated, _, info = env.step("I need facts. <search>distributed actors</search>")
    assert observation == ("\n\n<information>Doc 1(Title: Ray) Ray runs distributed Python actors.\n</information>\n\n")
    assert reward == 0.5 and not terminated and info["metrics"] == {"tool_use_counter": 1, "tool_success_counter": 1}
    # the same tool under hermes keeps roll's wording
    hermes = build_wrapper(ArithmeticEnv(), {}, tool_configs)
    assert hermes.tools[0].call("search", {"query": "tensor"}).output == "[1] PyTorch: PyTorch is a tensor library."


def test_function_episode_in_gem_format() -> None:
    env = ToolEnvWrapper(ArithmeticEnv(), [Calculator()], tool_reward=0.25, tool_format="gem")
    question, _ = env.reset(seed=0)
    assert "<tool_name>NAME</tool_name>" in question and '"name": "calc"' in question
    observation, reward, _, _, info = env.step(
        "<tool_call><tool_name>calc</tool_name><arguments>{}</arguments></tool_call>"
    )
    assert observation == "\n<tool_response>\nbad arguments: 'a'\n</tool_response>\n" and reward == 0.25
    observation, *_ = env.step('<tool_call>{"tool_name": "calc", "tool_params": {"a": 2, "b": 5}}</tool_call>')
    assert observation == "\n<tool_response>\n7\n</tool_response>\n"
    observation, *_, info = env.step("<tool_call><tool_name>nope</tool_name><arguments>{}</arguments></tool_call>")
    assert "unknown tool 'nope'" in observation and observation.startswith("\n<tool_response>\n")
    assert info["metrics"] == {"tool_use_counter": 3, "tool_success_counter": 1}


@pytest.mark.extra("mcp")
def test_mcp_episode_in_gem_format() -> None:
    pytest.importorskip("mcp")
    server = str(Path(__file__).with_name("mcp_calc_server.py"))
    tool_configs = [{"tool_id": "mcp", "tool_args": {"command": sys.executable, "args": [server], "timeout_s": 60}}]
    env = build_wrapper(ArithmeticEnv(), {"tool_format": "gem", "tool_success_reward": 1.0}, tool_configs)
    try:
        question, _ = env.reset(seed=0)
        assert "<tools>" in question and '"name": "add"' in question
        action = '<tool_call><tool_name>add</tool_name><arguments>{"a": 2, "b": 40}</arguments></tool_call>'
        observation, reward, _, _, info = env.step(action)
        assert observation == "\n<tool_response>\n42\n</tool_response>\n" and reward == 1.0
        assert info["metrics"] == {"tool_use_counter": 1, "tool_success_counter": 1}
    finally:
        env.close()


def test_tool_format_is_checked() -> None:
    with pytest.raises(ConfigError, match="tool_format 'xml'"):
        ToolEnvWrapper(ArithmeticEnv(), [Calculator()], tool_format="xml")
    with pytest.raises(ValueError, match="tool_format 'xml'"):
        ToolWrapperConfig(wrapper_args={"tool_format": "xml"})
    with pytest.raises(ValueError, match=r"tool_format \['gem'\]"):
        ToolWrapperConfig(wrapper_args={"tool_format": ["gem"]})
    assert ToolWrapperConfig(wrapper_args={"tool_format": "gem"}).wrapper_args == {"tool_format": "gem"}
