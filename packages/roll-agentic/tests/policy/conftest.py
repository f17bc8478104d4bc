"""A local server that mimics an OpenAI completions or chat endpoint, checking chat requests as OpenAI does."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_schema_error(body: dict) -> str | None:
    """What OpenAI's chat API would refuse in ``body`` (its 400 message), or None: roles and contents, assistant
    ``tool_calls`` each answered by a ``tool`` message with its id before the next other message, no call id used twice
    in the conversation, no ``tool`` message without a call to answer, ``tools`` entries that are well-formed function
    schemas with unique names."""
    pending: list[str] = []  # ids of the last assistant's calls not yet answered
    called: set[str] = set()  # every call id so far: OpenAI refuses one used twice ("Duplicate value for ...")
    for i, message in enumerate(body.get("messages") or [None]):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return f"messages[{i}]: invalid message {message!r:.80}"
        role, content = message["role"], message.get("content")
        if role != "tool" and pending:
            return f"messages[{i}]: tool_calls {pending} of the assistant message before are not answered"
        if role == "tool":
            if set(message) != {"role", "tool_call_id", "content"} or not isinstance(content, str):
                return f"messages[{i}]: a tool message has exactly role, tool_call_id and a string content"
            if message["tool_call_id"] not in pending:
                return f"messages[{i}]: tool_call_id {message['tool_call_id']!r} answers no tool_calls"
            pending.remove(message["tool_call_id"])
        elif role == "assistant" and "tool_calls" in message:
            calls = message["tool_calls"]
            if not isinstance(calls, list) or not calls or not (content is None or isinstance(content, str)):
                return f"messages[{i}]: tool_calls must be a non-empty list, content a string or null"
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(function, dict)
                    or set(call) != {"id", "type", "function"}
                    or call["type"] != "function"
                    or not isinstance(call["id"], str)
                    or set(function) != {"name", "arguments"}
                    or not isinstance(function["arguments"], str)
                ):
                    return f"messages[{i}]: invalid tool call {call!r:.120}"
                if call["id"] in called:
                    return f"messages[{i}]: Duplicate value for 'tool_call_id' of {call['id']!r}"
                called.add(call["id"])
                pending.append(call["id"])
        elif not isinstance(content, str | list):
            return f"messages[{i}]: content must be a string"
    if pending:
        return f"tool_calls {pending} of the last assistant message are not answered"
    names = []
    for j, tool in enumerate(body.get("tools", [])):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict):
            return f"tools[{j}]: must be {{'type': 'function', 'function': {{...}}}}"
        if not _FUNCTION_NAME.match(str(function.get("name", ""))):
            return f"tools[{j}].function.name {function.get('name')!r} is invalid"
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            return f"tools[{j}].function.parameters must be a JSON schema object"
        names.append(function["name"])
    if len(set(names)) != len(names):
        return f"tools: duplicate function names {names}"
    return None


class Endpoint:
    """Answers POST /v1/completions (or chat/completions) from ``replies`` (status, body: JSON, or bytes sent as they
    are), the last one repeated, or
    from ``answer(body)`` when set; records the requests. A chat request that OpenAI would refuse gets its 400."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, dict]] = [
            (200, {"choices": [{"text": "<answer>Up</answer>", "finish_reason": "stop"}]})
        ]
        self.answer: Callable[[dict], dict] | None = None
        self.cut_after: int | None = None
        self.seen: list[tuple[str, dict, str]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.seen.append((self.path, body, self.headers.get("Authorization", "")))
                error = chat_schema_error(body) if self.path.endswith("/chat/completions") else None
                if error is not None:
                    status, reply = 400, {"error": {"message": error, "type": "invalid_request_error"}}
                elif endpoint.answer is not None:
                    status, reply = 200, endpoint.answer(body)
                else:
                    status, reply = endpoint.replies.pop(0) if len(endpoint.replies) > 1 else endpoint.replies[0]
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # cut_after: the connection drops after that many bytes of the body (IncompleteRead on the client)
                self.wfile.write(data if endpoint.cut_after is None else data[: endpoint.cut_after])

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.fixture(name="chat_schema_error")
def chat_schema_error_fixture() -> Callable[[dict], str | None]:
    """:func:`chat_schema_error`, for tests that check a request body themselves."""
    return chat_schema_error
