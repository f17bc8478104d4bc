"""Stand-ins for ROCK, for tests and dry runs without a ROCK service: a scripted sandbox and agent, and an
in-process fake of the ROCK service's sandbox endpoints (:class:`FakeRockService`) for tests that run rl-rock's SDK.

``sandbox_cls: roll.agentic.env.rock.testing:ScriptedRockSandbox`` in a ``rock_tb_native_env`` entry's env_config
replaces ROCK's SDK (see :class:`~roll.agentic.env.rock.sandbox.SandboxClient`). The scripted agent's first LLM
request is a system message and the task prompt with one ``bash`` tool; a reply with a ``bash`` tool call is "run"
(recorded in ``commands``) and answered with a tool message ``ran: <command>``; a reply without a tool call ends
its session. ``run-tests.sh`` answers with ``scenario["test_log"]`` (a passing pytest summary by default).
``scenario`` keys: ``start_fails``, ``no_first_request``, ``later_sessions_end`` (a session after the first sends
no request), ``hang`` (seconds each relay takes), ``tests_raise``, ``test_log``. Every
instance is kept in ``made`` (class attributes: one process's record).
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

__all__ = ["BASH_TOOL", "FakeRockService", "RockCall", "ScriptedRockSandbox", "write_tasks"]

BASH_TOOL = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}


class ScriptedRockSandbox:
    """A scripted ROCK sandbox and agent (see the module)."""

    made: ClassVar[list[ScriptedRockSandbox]] = []
    scenario: ClassVar[dict[str, Any]] = {}

    def __init__(self, image: str, config: Any) -> None:
        self.image, self.config = image, config
        self.sandbox_id = f"sb-{len(self.made)}"
        self.commands: list[str] = []  # agent tool commands
        self.runs: list[str] = []  # env commands (tests)
        self.uploads: list[str] = []
        self.prompts: list[str] = []
        self.stopped = 0
        self.made.append(self)

    def start(self) -> None:
        if self.scenario.get("start_fails"):
            raise RuntimeError("image pull failed")

    def install_agent(self) -> None:
        self.project_path = self.config.agent_config["project_path"]

    def start_agent(self, prompt: str) -> None:
        self.prompts.append(prompt)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": prompt},
        ]

    def anti_call(self, index: int, response_payload: str | None) -> str:
        if self.scenario.get("hang"):
            time.sleep(self.scenario["hang"])
        if response_payload is None and self.scenario.get("no_first_request"):
            return "SESSION_END"
        if response_payload is None and len(self.prompts) > 1 and self.scenario.get("later_sessions_end"):
            return "SESSION_END"
        if response_payload is None:
            return "log line\n" + json.dumps({"messages": self.messages, "tools": [BASH_TOOL]})
        message = json.loads(response_payload)["choices"][0]["message"]
        self.messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return "SESSION_END"
        command = json.loads(calls[0]["function"]["arguments"])["command"]
        self.commands.append(command)
        self.messages.append({"role": "tool", "content": f"ran: {command}"})
        return json.dumps({"messages": self.messages, "tools": [BASH_TOOL]})

    def run(self, command: str, timeout: float) -> tuple[int, str]:
        self.runs.append(command)
        if "run-tests.sh" in command:
            if self.scenario.get("tests_raise"):
                raise ConnectionError("service gone")
            return 0, self.scenario.get("test_log", "===== short test summary info =====\n3 PASSED")
        return 0, ""

    def upload(self, local_path: str, remote_path: str) -> None:
        if not Path(local_path).is_file():
            raise FileNotFoundError(local_path)
        self.uploads.append(remote_path)

    def stop(self) -> None:
        self.stopped += 1


def write_tasks(folder: Path, count: int = 2) -> dict[str, Any]:
    """A task file of ``count`` SWE-bench-like tasks (ids 1..count) and their test folders under ``folder``; the
    env_config keys that point at them and at :class:`ScriptedRockSandbox`."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = folder / "tasks.jsonl"
    rows = [
        {"id": i, "prompt": f"Fix bug {i}", "sandbox_image": f"swebench/sweb.eval:t{i}", "task_name": f"t{i}"}
        for i in range(1, count + 1)
    ]
    tasks.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for i in range(1, count + 1):
        (folder / "bench" / f"t{i}" / "tests").mkdir(parents=True)
        (folder / "bench" / f"t{i}" / "run-tests.sh").write_text("pytest\n")
        (folder / "bench" / f"t{i}" / "tests" / "test_x.py").write_text("def test(): pass\n")
    return {
        "dataset_name": str(tasks),
        "test_files": [str(folder / "bench")],
        "agent_config": {"agent_type": "default", "run_cmd": "iflow -p <<PROMPT>> --yolo"},
        "sandbox_cls": "roll.agentic.env.rock.testing:ScriptedRockSandbox",
    }


class RockCall(NamedTuple):
    """One call a :class:`FakeRockService` received: the endpoint's name (``start_async``, ``get_status/sb-1``...),
    its JSON body (``{}`` for a GET) and its HTTP headers."""

    name: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeRockService(ThreadingHTTPServer):
    """ROCK's sandbox endpoints (``/apis/envs/sandbox/v1/<name>`` on a free localhost port) in this process.

    Every call is kept in ``calls``. ``get_status`` answers that the sandbox is alive, or, with ``pull_fails`` set,
    that its image pull failed; a POST is answered by :meth:`handle` (``start_async``: the sandbox's id and host;
    others: an empty result), which a test overrides to serve more (e.g. sessions run by a local sandbox). Inside
    ``with``, it serves from a thread and localhost bypasses any HTTP proxy (the SDK honours ``*_PROXY``)."""

    PREFIX = "/apis/envs/sandbox/v1/"
    _NO_PROXY = ("NO_PROXY", "no_proxy")

    def __init__(self, sandbox_id: str = "sb-1", host_ip: str = "10.0.0.1") -> None:
        super().__init__(("127.0.0.1", 0), _RockHandler)
        self.sandbox_id, self.host_ip = sandbox_id, host_ip
        self.calls: list[RockCall] = []
        self.pull_fails = False
        self._saved: dict[str, str | None] = {}
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def names(self) -> list[str]:
        return [call.name for call in self.calls]

    def status(self) -> dict[str, Any]:
        failed = {"image_pull": {"status": "failed", "message": "no such image"}} if self.pull_fails else None
        return {"sandbox_id": self.sandbox_id, "host_name": "h", "is_alive": not failed, "status": failed}

    def handle(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """The ``result`` of a POST to ``name``."""
        if name == "start_async":
            return {"sandbox_id": self.sandbox_id, "host_name": "h", "host_ip": self.host_ip}
        return {}

    def __enter__(self) -> FakeRockService:
        for key in self._NO_PROXY:
            self._saved[key] = os.environ.get(key)
            os.environ[key] = ",".join(filter(None, [os.environ.get(key), "127.0.0.1"]))
        self._thread = threading.Thread(target=self.serve_forever, name="fake-rock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _RockHandler(BaseHTTPRequestHandler):
    server: FakeRockService

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, result: dict[str, Any]) -> None:
        data = json.dumps({"status": "Success", "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # get_status/<sandbox id>
        name = self.path.removeprefix(FakeRockService.PREFIX).split("?")[0]
        self.server.calls.append(RockCall(name, {}, dict(self.headers)))
        self._answer(self.server.status())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        name = self.path.removeprefix(FakeRockService.PREFIX)
        self.server.calls.append(RockCall(name, body, dict(self.headers)))
        self._answer(self.server.handle(name, body))
