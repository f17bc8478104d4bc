"""Hermes/Qwen tool-call parsing."""

from __future__ import annotations

from roll.agentic.tools import ToolCall, format_tool_call, parse_tool_calls


def test_one_and_several_calls() -> None:
    text = 'Let me check.<tool_call>{"name": "search", "arguments": {"query": "ray"}}</tool_call>'
    assert parse_tool_calls(text).calls == [ToolCall("search", {"query": "ray"})]
    two = format_tool_call("a", {"x": 1}) + "\n" + format_tool_call("b", {})
    parsed = parse_tool_calls(two)
    assert [c.name for c in parsed.calls] == ["a", "b"] and parsed.errors == [] and parsed.present


def test_no_call() -> None:
    parsed = parse_tool_calls("<answer>4</answer>")
    assert not parsed.present and parsed.calls == [] and parsed.errors == []


def test_string_arguments_and_unclosed_call() -> None:
    parsed = parse_tool_calls('<tool_call>\n{"name": "python_code", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n')
    assert parsed.calls == [ToolCall("python_code", {"code": "print(1)"})]


def test_malformed_calls_are_reported() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "x", </tool_call><tool_call>{"arguments": {}}</tool_call>')
    assert parsed.calls == [] and len(parsed.errors) == 2 and parsed.present
    mixed = parse_tool_calls(format_tool_call("a", {}) + "<tool_call>{</tool_call>" + format_tool_call("b", {}))
    assert [b.name if isinstance(b, ToolCall) else "error" for b in mixed.blocks] == ["a", "error", "b"]
    assert "not valid JSON" in parsed.errors[0] and '"name"' in parsed.errors[1]
    bad_args = parse_tool_calls('<tool_call>{"name": "x", "arguments": [1, 2]}</tool_call>')
    assert "must be a JSON object" in bad_args.errors[0]


def test_a_stray_opening_tag_does_not_swallow_the_call_after_it() -> None:
    # the first <tool_call> (mentioned while thinking, or left unclosed) ran to the real call's </tool_call>: one
    # unreadable block, and the call was lost
    call = format_tool_call("python_code", {"code": "print(1)"})
    for text in (f"<think>I will write a <tool_call> block.</think>\n{call}", f'<tool_call>{{"name": "x"\n{call}'):
        parsed = parse_tool_calls(text)
        assert parsed.calls == [ToolCall("python_code", {"code": "print(1)"})] and len(parsed.errors) == 1


def test_llama_style_parameters_are_the_arguments() -> None:
    # Llama 3 writes {"name", "parameters"}: the parameters were dropped and the tool ran with none
    parsed = parse_tool_calls('<tool_call>{"name": "calc", "parameters": {"a": 1, "b": 2}}</tool_call>')
    assert parsed.calls == [ToolCall("calc", {"a": 1, "b": 2})]
