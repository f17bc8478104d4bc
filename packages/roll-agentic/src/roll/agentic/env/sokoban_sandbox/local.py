"""A stand-in for a ``sokoban_sandbox`` sandbox on this machine: no ROCK service, no image, the real game.

``sandbox_cls: roll.agentic.env.sokoban_sandbox.local:LocalSandbox`` in the env_config. ``start`` writes roll's
``/app`` (:func:`~roll.agentic.env.sokoban_sandbox.app.write_app`) into a temporary folder and picks a free port;
each command then runs as ``bash -c`` in its own process group, with ``cd /app`` going to that folder, ``python``
being this interpreter limited to the standard library (``-E -s -S``: what the image offers) and ``SOKOBAN_PORT``
set, so ``cd /app && python server.py &`` starts a real server process and the client talks to it over HTTP.
Sessions are names (a command in a session not created first is refused, as ROCK refuses it), not shells that keep
state. ``stop`` kills every process group a command started (the server with them) and removes the folder.
Linux only (it reads ``/proc`` to see that the processes are gone).

Tests replace :meth:`LocalSandbox.prepare_app` to break the app (a server that never answers, a client that prints
something else) and still exercise the env's real protocol.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from roll.agentic.env.sokoban_sandbox.app import write_app

__all__ = ["LocalSandbox", "live_processes"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def live_processes(groups: set[int]) -> list[int]:
    """The pids of processes in ``groups`` (process group ids) that still run (zombies do not)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone while we looked
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if fields[0] not in ("Z", "X") and int(fields[2]) in groups:
            found.append(int(entry.name))
    return found


class LocalSandbox:
    """One sandbox: a temporary folder holding ``/app`` and the processes its commands started (see the module)."""

    STOP_WAIT_S = 5.0

    def __init__(self, config: Any) -> None:
        self.config = config
        self.sandbox_id = ""
        self.server_port = 0
        self.root: Path | None = None
        self.sessions: set[str] = set()
        self.commands: list[tuple[str, str]] = []  # (session, command), for tests
        self.groups: set[int] = set()

    def prepare_app(self, app: Path) -> None:
        """Write the game's files into ``app`` (tests override it to break them)."""
        write_app(app)

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="roll-sokoban-sandbox-"))
        self.sandbox_id = f"local-{self.root.name.rsplit('-', 1)[-1]}"
        self.prepare_app(self.root / "app")
        self.server_port = _free_port()

    def is_alive(self) -> bool:
        return self.root is not None and self.root.is_dir()

    def create_session(self, name: str) -> None:
        if self.root is None:
            raise RuntimeError("create_session() before start()")
        self.sessions.add(name)

    def run(self, command: str, session: str, timeout: float) -> str:
        if self.root is None:
            raise RuntimeError("run() on a sandbox that is not started")
        if session not in self.sessions:
            raise RuntimeError(f"no session {session!r} in sandbox {self.sandbox_id}; create it first")
        self.commands.append((session, command))
        app, python = shlex.quote(str(self.root / "app")), shlex.quote(sys.executable)
        prelude = (
            f'cd() {{ if [ "$1" = /app ]; then builtin cd {app}; else builtin cd "$@"; fi; }}\n'
            f'python() {{ {python} -E -s -S "$@"; }}\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(SOKOBAN_PORT=str(self.server_port), HOME=str(self.root))
        # output to a file, not a pipe: a background server keeps it open, a pipe would wait for the server's end
        with tempfile.TemporaryFile(dir=self.root) as out:
            process = subprocess.Popen(
                ["bash", "-c", prelude + command],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.groups.add(process.pid)  # its own session: the group id is its pid
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill(process.pid)
                process.wait()
                raise TimeoutError(f"`{command}` took over {timeout:g} s in sandbox {self.sandbox_id}") from None
            out.seek(0)
            return out.read().decode(errors="replace")

    def stop(self) -> None:
        """Kill every process a command started and remove the folder; safe to call twice."""
        for group in self.groups:
            self._kill(group)
        deadline = time.monotonic() + self.STOP_WAIT_S
        while live_processes(self.groups) and time.monotonic() < deadline:
            time.sleep(0.05)
        root, self.root = self.root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    @staticmethod
    def _kill(group: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(group, signal.SIGKILL)
