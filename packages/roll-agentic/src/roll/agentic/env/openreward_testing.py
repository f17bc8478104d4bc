"""A local stand-in for OpenReward's environment server, for tests and dry runs of ``openreward_env`` offline.

:class:`FakeOpenRewardServer` speaks the HTTP API the ``openreward`` SDK (0.1.x) uses for environments: sessions
made over server-sent events (``/create_session``, then ``/create`` with the task's split and index), the task's
``/task_tools`` and ``/prompt``, tool calls over server-sent events (``/call``), ``/num_tasks``, keep-alive
``/ping`` and ``/delete`` + ``/delete_session``. Point the SDK at it with the variables of :meth:`env`
(``OPENREWARD_SESSION_URL`` ...), and any key in ``OPENREWARD_API_KEY`` but the server's ``api_key`` is refused
(401). Environments are ``environments`` (name -> number of tasks); another name is "Deployment not found" (404).

Every environment has the task prompt ``Task <index>: ...`` and four tools: ``bash`` answers ``ran: <command>``
(reward none), ``score`` gives its ``value`` as the reward, ``submit`` gives 1 when ``answer`` is ``"42"`` (else 0)
and finishes the task, ``crash`` fails on the server's side (an SSE ``error`` event: the SDK's ``ToolFailed``); any
other name is refused as not a valid tool. ``create_failures`` makes that many ``/create`` calls fail with HTTP 500
(a session whose set-up fails: the client must delete it). The record: ``calls`` (session index, tool, input),
``created`` and ``deleted`` session ids; :attr:`open_sessions` is what was created and not deleted.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FAKE_API_KEY", "FakeOpenRewardServer"]

FAKE_API_KEY = "fake-openreward-key"


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()}}
    return {"name": name, "description": description, "input_schema": schema}


TOOLS = [
    _tool("bash", "Run a shell command.", command="string"),
    _tool("score", "Give a partial reward.", value="number"),
    _tool("submit", "Submit the final answer.", answer="string"),
    _tool("crash", "Fail on the server's side."),
]


class FakeOpenRewardServer:
    """An in-process OpenReward environment server on ``127.0.0.1`` (see the module); a context manager."""

    def __init__(self, environments: dict[str, int] | None = None, api_key: str = FAKE_API_KEY) -> None:
        self.environments = dict(environments or {"test/Echo": 5})
        self.api_key = api_key
        self.create_failures = 0
        self.calls: list[tuple[int, str, dict[str, Any]]] = []
        self.created: list[str] = []
        self.deleted: set[str] = set()
        self.lock = threading.Lock()
        self._tasks: dict[str, int] = {}  # session id -> task index
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openreward", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self) -> dict[str, str]:
        """Environment variables that point the SDK here (and keep it from asking PyPI for updates)."""
        return {
            "OPENREWARD_SESSION_URL": self.url,
            "OPENREWARD_API_URL": self.url,
            "OPENREWARD_DISABLE_UPDATE_CHECK": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    @property
    def open_sessions(self) -> list[str]:
        with self.lock:
            return [sid for sid in self.created if sid not in self.deleted]

    def __enter__(self) -> FakeOpenRewardServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- the API ------------------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, Any, bool]:
        """``(status, payload, as_sse)`` of one request."""
        if headers.get("X-API-Key") != self.api_key:
            return 401, "Invalid API key", False
        if path in ("/ping", "/delete", "/delete_session"):
            if path != "/ping" and headers.get("X-Session-ID"):
                with self.lock:
                    self.deleted.add(headers["X-Session-ID"])
            return 200, None, False
        deployment = headers.get("X-Deployment", "")
        if path == "/create_session":
            if deployment not in self.environments:
                return 404, {"detail": "Deployment not found."}, False
            with self.lock:
                sid = f"sid-{len(self.created)}"
                self.created.append(sid)
            return 200, [("task_id", sid), ("end", json.dumps({"sid": sid}))], True
        sid = headers.get("X-Session-ID", "")
        if path == "/num_tasks":
            return 200, {"num_tasks": self.environments[deployment]}, False
        if path == "/create":
            with self.lock:
                if self.create_failures > 0:
                    self.create_failures -= 1
                    return 500, {"detail": "the environment did not start"}, False
            index = int(body["index"])
            if not 0 <= index < self.environments[deployment]:
                return 400, {"detail": f"index {index} out of range"}, False
            with self.lock:
                self._tasks[sid] = index
            return 200, {}, False
        if path == "/task_tools":
            return 200, {"tools": TOOLS}, False
        if path == "/prompt":
            index = self._tasks[sid]
            return 200, [{"type": "text", "text": f"Task {index}: find the answer and submit it."}], False
        if path == "/call":
            return 200, self._call(sid, str(body["name"]), body.get("input") or {}), True
        return 404, {"detail": f"no route {method} {path}"}, False

    def _call(self, sid: str, name: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
        with self.lock:
            self.calls.append((self._tasks[sid], name, dict(arguments)))
        if name == "crash":
            return [("task_id", f"call-{len(self.calls)}"), ("error", "the tool raised RuntimeError: boom")]
        if name == "bash":
            output = _output(f"ran: {arguments.get('command', '')}", None, False)
        elif name == "score":
            output = _output("scored", float(arguments.get("value", 0)), False)
        elif name == "submit":
            right = str(arguments.get("answer", "")) == "42"
            output = _output("correct" if right else "wrong", 1.0 if right else 0.0, True)
        else:
            output = {"ok": False, "error": f"{name!r} is not a valid tool", "reason": "not_found"}
        return [("task_id", f"call-{len(self.calls)}"), ("end", json.dumps(output))]


def _output(text: str, reward: float | None, finished: bool) -> dict[str, Any]:
    blocks = [{"type": "text", "text": text}]
    return {"ok": True, "output": {"blocks": blocks, "metadata": {}, "reward": reward, "finished": finished}}


def _handler(server: FakeOpenRewardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            status, payload, sse = server.handle(method, self.path, self.headers, body)
            if sse:
                data = "".join(f"event: {event}\ndata: {text}\n\n" for event, text in payload).encode()
                kind = "text/event-stream"
            else:
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                kind = "application/json"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the record is on the server object

    return Handler
