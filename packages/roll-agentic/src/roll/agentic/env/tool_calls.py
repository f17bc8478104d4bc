"""Message-list ("agent-native") observations: OpenAI-style chat messages, tool calls read from replies.

An agent-native env (ROLL's ``AgentNativeStepEnvManager`` envs) answers ``reset``/``step`` with the whole
conversation so far, a list of ``{"role": ..., "content": ..., "tool_calls": [...]}`` messages, and lists its
tools (OpenAI function schemas) in the reset ``info["tools"]``. The manager renders that list with the chat
template each turn; the env reads the model's reply with :func:`assistant_message`.

:func:`parse_native_tool_calls` follows ROLL's ``Qwen3CoderActionParser.parse_action``: ``<function=NAME>`` blocks with
``<parameter=KEY>value</parameter>`` children (values coerced to bool/null/int/float/JSON when they read as such),
or ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` JSON blocks, each ``<tool_call>`` block read by
its own form (a block ends at its ``</tool_call>``, the next ``<tool_call>`` or the end of the reply); a block that
does not parse is skipped. :func:`assistant_message` follows ROLL's ``SandboxManagerV2.format_response_payload``:
a reply with ``<tool_call>`` is valid only when at least one call parsed (the content is then the text before the
first ``<tool_call>``); a reply without one is a plain (final) answer and valid. (:mod:`roll.agentic.tools.parsing`
is the tool wrapper's reader, ROLL's ``tool_wrapper`` semantics: there a block that does not parse is reported to the
model as a failed call.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TOOL_CALL_BLOCK",
    "AssistantTurn",
    "assistant_message",
    "call_arguments",
    "check_messages",
    "normalize_messages",
    "parse_native_tool_calls",
]

_FUNCTION = re.compile(r"<function\s*=\s*([^>]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter\s*=\s*([^>]+)>(.*?)</parameter>", re.DOTALL)
# A <tool_call> block (the Hermes/Qwen form; the tool wrapper's reader, roll.agentic.tools.parsing, takes the same):
# the last block may be unclosed (the reply was cut, or the model stopped after the JSON): it runs to the end; a
# block left unclosed before another <tool_call> (or the tag mentioned in prose) ends there, not swallowing that call
TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)


def _coerce(value: str) -> Any:
    value = value.strip()
    if value in ("true", "false", "null"):
        return json.loads(value)
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if re.fullmatch(r"-?\d+\.\d+", value):
        return float(value)
    if value[:1] + value[-1:] in ("[]", "{}"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def call_arguments(call: dict[str, Any]) -> Any:
    """The arguments of a JSON tool call: its ``arguments`` (Llama 3's ``parameters``), and where a model wrote them
    as a JSON string (OpenAI's wire form) their value, so they are not encoded twice; a string that does not parse
    stays as written (the caller decides whether that is a failed call)."""
    arguments = call["arguments"] if "arguments" in call else call.get("parameters", {})
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments


def _call(name: str, arguments: Any, index: int) -> dict[str, Any]:
    # ROLL ids carry a wall-clock time; ours are deterministic so equal replies render equal prompts.
    return {
        "type": "function",
        "id": f"{name}_{index}",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def parse_native_tool_calls(response: str) -> list[dict[str, Any]] | None:
    """The OpenAI-style tool calls of ``response`` (arguments as JSON strings); ``None`` when it has no tool-call
    markup at all, ``[]`` when it has some but no block parsed."""
    if "<tool_call>" in response:
        blocks = TOOL_CALL_BLOCK.findall(response)
    elif "<function" in response:
        blocks = [response]
    else:
        return None
    calls: list[dict[str, Any]] = []
    index = 0  # ids number the blocks (a JSON block that does not parse keeps its number) and XML functions
    for block in blocks:
        # a block is Hermes JSON or Qwen3-Coder XML by its own start: "<function" in a JSON call's text (code,
        # HTML, the model's prose) read the whole reply as XML, which found no call and dropped every JSON one
        if block.lstrip().startswith("{"):
            call = _json_call(block, index)
            if call is not None:
                calls.append(call)
            index += 1
            continue
        for name, body in _FUNCTION.findall(block):
            params = {key.strip(): _coerce(value) for key, value in _PARAMETER.findall(body)}
            calls.append(_call(name.strip(), params, index))
            index += 1
    return calls


def _json_call(block: str, index: int) -> dict[str, Any] | None:
    try:
        parsed = json.loads(block.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    return _call(str(parsed.get("name", "")), call_arguments(parsed), index)


@dataclass(frozen=True)
class AssistantTurn:
    """The assistant message a reply becomes, and whether it was well-formed (``action_is_valid``)."""

    message: dict[str, Any]
    valid: bool

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls", []))


def assistant_message(response: str) -> AssistantTurn:
    """ROLL's reading of a reply: tool calls when ``<tool_call>`` parses, else the reply as plain content."""
    if "<tool_call>" not in response:
        return AssistantTurn({"role": "assistant", "content": response}, True)
    calls = parse_native_tool_calls(response) or []
    if not calls:
        return AssistantTurn({"role": "assistant", "content": response}, False)
    content = response.split("<tool_call>", 1)[0]
    return AssistantTurn({"role": "assistant", "content": content, "tool_calls": calls}, True)


def check_messages(observation: Any, where: str) -> list[dict[str, Any]]:
    """``observation`` as a list of chat messages, or ``ValueError`` saying which item is wrong."""
    if not isinstance(observation, list) or not observation:
        raise ValueError(f"{where}: an agent-native observation must be a non-empty list of chat messages")
    for i, message in enumerate(observation):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where}: message {i} must be a dict with a 'role' (got {message!r:.80})")
    return observation


def normalize_messages(messages: list[dict[str, Any]], parse_arguments: bool = False) -> list[dict[str, Any]]:
    """ROLL's ``convert_list_content_str``: list contents joined into text, an assistant's null content (OpenAI's form
    next to ``tool_calls``) empty, other non-text contents ``str()``-ed;
    with ``parse_arguments`` (ROLL's ``parse_tool_call_parameter_to_dict``) JSON-string tool-call arguments of
    assistant messages become dicts, and a message whose arguments do not parse gets its calls appended to its
    content instead."""
    out = []
    for message in messages:
        converted = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            parts = [item.get("text") if isinstance(item, dict) else item for item in content]
            converted["content"] = "".join(p for p in parts if isinstance(p, str))
        elif content is None and message.get("role") == "assistant":
            # OpenAI's form of a turn that only calls tools: str() made it the text "None" before the calls
            converted["content"] = ""
        elif not isinstance(content, str):
            converted["content"] = str(content)
        if parse_arguments and message.get("role") == "assistant" and message.get("tool_calls"):
            try:
                converted["tool_calls"] = [_arguments_to_dict(call) for call in message["tool_calls"]]
            except (json.JSONDecodeError, KeyError, TypeError):
                calls = converted.pop("tool_calls")
                converted["content"] = f"{converted['content']}{calls}"
        out.append(converted)
    return out


def _arguments_to_dict(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = json.loads(function["arguments"])
    return {**call, "function": function}
