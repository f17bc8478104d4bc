"""Parent-side plumbing of a sandboxed run: in-memory input files and capped, deadline-bound output collection."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Collected", "collect_output", "memfd_with"]


@contextlib.contextmanager
def memfd_with(data: bytes) -> Iterator[int]:
    """A readable descriptor positioned at the start of ``data``, backed by memory (no file to find or race on)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("roll-sandbox", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux fallback: an unlinked temporary file
        with tempfile.TemporaryFile() as f:
            fd = os.dup(f.fileno())
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


@dataclass
class Collected:
    """What a finished child left: its (capped) output, exit code, why we stopped it (if we did), CPU used."""

    stdout: bytes
    stderr: bytes
    returncode: int
    stop: str | None
    cpu_s: float
    duration_s: float


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9 or a kernel before 5.3
        return None


def _read_until(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytearray, bytearray, str | None]:
    """Read both pipes until the program exits (then drain what is buffered), the deadline passes or ``cap`` bytes
    arrived. A process the program left behind may hold the pipes open, so EOF alone cannot end the run."""
    out, err = bytearray(), bytearray()
    buffers = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}  # type: ignore[union-attr]
    pidfd = _pidfd(proc.pid)  # readable once the process exits; None: poll instead
    exited = False
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        try:
            while len(selector.get_map()) > (0 if pidfd is None or exited else 1):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return out, err, "timeout"
                timeout = 0.0 if exited else (remaining if pidfd is not None else min(remaining, 0.05))
                events = selector.select(timeout)
                if exited and not events:
                    break  # the program is gone and nothing more is buffered
                for key, _ in events:
                    if key.fd == pidfd:
                        exited = True
                        selector.unregister(pidfd)
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffers[key.fd] += chunk
                    if len(out) + len(err) > cap:
                        return out, err, "output"
                exited = exited or (pidfd is None and _exited(proc.pid))
        finally:
            if pidfd is not None:
                os.close(pidfd)
    return out, err, None


def _wait_exit(pid: int, deadline: float) -> str | None:
    """Wait (without reaping, so the process group id stays ours) until ``pid`` exits or the deadline passes."""
    delay = 0.001
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return "timeout"
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return None


def collect_output(proc: subprocess.Popen, timeout_s: float, cap: int) -> Collected:
    """Read the child's stdout/stderr until it exits, ``timeout_s`` passes or ``cap`` bytes arrived; then SIGKILL
    its whole process group (stragglers included) and reap it."""
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        out, err, stop = _read_until(proc, deadline, cap)
        if stop is None:
            stop = _wait_exit(proc.pid, deadline)
    finally:  # also on an exception here (e.g. KeyboardInterrupt): never leave the program running
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the leader is not reaped yet, so this group id cannot be reused
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    duration = time.monotonic() - start
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return Collected(
        bytes(out[:cap]), bytes(err[:cap]), proc.returncode, stop, usage.ru_utime + usage.ru_stime, duration
    )
