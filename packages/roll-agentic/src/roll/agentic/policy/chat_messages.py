"""Tool calls between roll's envs and a hosted chat API (``llm_proxy`` openai with ``api: chat``).

Roll's envs read tool calls from the answer's text, in their own format (Hermes ``<tool_call>`` JSON, GEM's tags);
hosted chat APIs answer calls as structured ``message.tool_calls`` and take them back the same way in the history:
an assistant message with ``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments": <JSON
string>}}``), each answered by a ``tool`` message whose ``tool_call_id`` is that id. :func:`answer_text` writes an
answer's structured calls as the env's text; :func:`openai_messages` checks a conversation against those rules and
sends any part that breaks them as text instead (the calls written into the assistant's content, their results as
``user`` messages), which every chat endpoint accepts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roll.agentic.policy.protocol import ChatTools
from roll.agentic.tools.parsing import format_tool_call
from roll.runtime import ConfigError

__all__ = ["answer_calls", "answer_text", "openai_messages"]

WriteCall = Callable[[str, Any], str]


def _arguments(raw: Any) -> Any:
    """A call's arguments as the env's writer takes them: the JSON object, else the raw value as given."""
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except json.JSONDecodeError:
        return raw
    return parsed if isinstance(parsed, dict) else raw


def answer_calls(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The ``{"name", "arguments"}`` of a chat answer's ``tool_calls`` (arguments as a JSON string), or a
    ConfigError naming ``where`` (the endpoint) when one is not a function call with a name."""
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ConfigError(
                f"{where} answered tool_calls[{i}] without function.name ({str(call)[:200]}); base_url must be an "
                "OpenAI-compatible chat endpoint"
            )
        name, raw = function["name"], function.get("arguments", "{}")
        calls.append({"name": name, "arguments": raw if isinstance(raw, str) else json.dumps(raw)})
    return calls


def answer_text(content: str, calls: list[dict[str, Any]], tools: ChatTools | None) -> str:
    """An answer as the env reads it: its content, then each call written in the env's format (``tools``' writer;
    Hermes without tools), one per line."""
    return _written(content, calls, tools.write_call if tools is not None else format_tool_call)


def _written(content: str, calls: list[dict[str, Any]], write: WriteCall) -> str:
    parts = [content] if content else []
    return "\n".join([*parts, *(write(call["name"], _arguments(call["arguments"])) for call in calls)])


def _openai_call(call: dict[str, Any]) -> dict[str, Any] | None:
    """``call`` in OpenAI's form, or None when it lacks an id or a name (then it can only go as text)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(call.get("id"), str) or not call["id"]:
        return None
    name, arguments = function.get("name"), function.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        return None
    arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call["id"], "type": "function", "function": {"name": name, "arguments": arguments}}


def _as_text(message: Mapping[str, Any], write: WriteCall) -> dict[str, Any]:
    """An assistant message whose calls are written into its content (the env's text of that turn)."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append({"name": str(function.get("name", "")), "arguments": function.get("arguments", "{}")})
    content = message.get("content")
    text = _written(content if isinstance(content, str) else "", calls, write)
    return {"role": "assistant", "content": text}


def openai_messages(
    messages: Sequence[Mapping[str, Any]], tools: ChatTools | None, native: bool = True
) -> list[dict[str, Any]]:
    """``messages`` as OpenAI's chat API accepts them: an assistant turn keeps its ``tool_calls`` when each has an id
    and the ``tool`` messages right after it answer exactly those ids (``native``: else every call goes as text);
    otherwise its calls are written into its content with ``tools``' writer (Hermes without tools) and its results,
    like any ``tool`` message that answers no call, go as ``user`` messages. A call id an earlier turn already sent
    goes with a suffix (its results too): OpenAI refuses a ``tool_call_id`` used twice in a conversation."""
    write = tools.write_call if tools is not None else format_tool_call
    out: list[dict[str, Any]] = []
    taken = {str(call.get("id")) for m in messages for call in m.get("tool_calls") or [] if isinstance(call, dict)}
    sent: set[str] = set()  # call ids already in ``out``: OpenAI refuses a tool_call_id used twice in a conversation
    i = 0
    while i < len(messages):
        message = messages[i]
        role = message.get("role")
        if role == "tool":  # a result that answers no call of the message before it
            out.append({"role": "user", "content": message.get("content", "")})
            i += 1
            continue
        if role != "assistant" or not message.get("tool_calls"):
            # an empty tool_calls list (OpenAI refuses it: minimum length 1), or a null one, is left out
            out.append({k: v for k, v in message.items() if k != "tool_calls" or role != "assistant"})
            i += 1
            continue
        end = i + 1
        while end < len(messages) and messages[end].get("role") == "tool":
            end += 1
        results = messages[i + 1 : end]
        calls = [_openai_call(call) for call in message["tool_calls"]]
        ids = [call["id"] for call in calls if call is not None]
        answered = [result.get("tool_call_id") for result in results]
        if native and None not in calls and len(set(ids)) == len(ids) and sorted(ids) == sorted(map(str, answered)):
            renamed = _unique_ids(ids, sent, taken)
            content = message.get("content")
            calls = [{**call, "id": renamed[call["id"]]} for call in calls if call is not None]
            out.append({"role": "assistant", "content": content or None, "tool_calls": calls})
            out += [
                {
                    "role": "tool",
                    "tool_call_id": renamed[str(result["tool_call_id"])],
                    "content": result.get("content", ""),
                }
                for result in results
            ]
        else:
            out.append(_as_text(message, write))
            out += [{"role": "user", "content": result.get("content", "")} for result in results]
        i = end
    return out


def _unique_ids(ids: list[str], sent: set[str], taken: set[str]) -> dict[str, str]:
    """Each of an assistant turn's call ids, or where an earlier turn sent it already (an env's per-turn ids, e.g.
    ``move_player_0`` every turn) a fresh ``<id>-<n>`` that no message uses; the new ids are added to ``sent``."""
    renamed = {}
    for call_id in ids:
        new, n = call_id, 0
        while new in sent or (new != call_id and new in taken):
            n += 1
            new = f"{call_id}-{n}"
        renamed[call_id] = new
        sent.add(new)
    return renamed
