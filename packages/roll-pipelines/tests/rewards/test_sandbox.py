"""The sandbox contains what model-written programs may try, and reports each outcome with a status and reason.

The first group runs with every layer; ``audit_hook=False`` (and ``seccomp=False``) groups check that the kernel
layers beneath the in-process audit hook contain the same programs on their own (skipped where a layer is absent).
"""

from __future__ import annotations

import ast
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from roll.pipelines.rewards import SandboxLimits, _sandbox_io, run_untrusted, sandbox_layers
from roll.pipelines.rewards import sandbox as sandbox_module
from roll.pipelines.rewards._sandbox_boot import seccomp_program
from roll.runtime import ConfigError

LAYERS = sandbox_layers()
HAS_SECCOMP = LAYERS.get("seccomp") == "on"
HAS_LANDLOCK = LAYERS.get("landlock", "unavailable") != "unavailable"
HAS_NETNS = LAYERS.get("namespaces", "unavailable") != "unavailable"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text("TOP-SECRET")
    return path


def test_layers_are_reported():
    assert LAYERS["rlimits"] == "on"
    assert {"namespaces", "landlock", "seccomp", "privileges", "disk quota"} <= set(LAYERS)


def test_program_reads_stdin_and_writes_stdout_in_its_own_directory():
    code = (
        "import os\nname = input()\nopen('n.txt', 'w').write(name)\nprint('hi', open('n.txt').read(), os.listdir('.'))"
    )
    result = run_untrusted(code, stdin="bob\n")
    assert (result.status, result.exit_code, result.reason) == ("ok", 0, "")
    assert result.stdout == "hi bob ['n.txt']\n"


def test_program_errors_are_reported_with_the_last_traceback_line():
    result = run_untrusted("def f():\n    raise ValueError('boom')\nf()")
    assert (result.status, result.exit_code, result.reason) == ("error", 1, "ValueError: boom")
    assert 'File "main.py", line 2, in f' in result.stderr
    assert run_untrusted("import sys; sys.exit(3)").reason == "exit code 3"


def test_environment_is_minimal_and_the_directory_is_removed(monkeypatch):
    monkeypatch.setenv("ROLL_TEST_SECRET_TOKEN", "hunter2")
    result = run_untrusted("import os\nprint(os.getcwd())\nprint(sorted(os.environ))")
    workdir, env = result.stdout.splitlines()
    assert "hunter2" not in result.stdout
    assert set(ast.literal_eval(env)) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR"}
    assert workdir.startswith(tempfile.gettempdir())
    assert not os.path.exists(workdir)


CONTAINED = {
    "read /etc/passwd": ("print(open('/etc/passwd').read())", "blocked", "filesystem"),
    "read a file outside the sandbox": ("print(open({secret!r}).read())", "blocked", "filesystem"),
    "write a file outside the sandbox": ("open({outside!r}, 'w').write('x')", "blocked", "filesystem"),
    "list the root directory": ("import os; print(os.listdir('/'))", "blocked", "filesystem"),
    "connect to localhost": (
        "import socket; socket.socket().connect(('127.0.0.1', 22))",
        "blocked",
        "blocked: network",
    ),
    "connect to an external IP": (
        "import socket; socket.create_connection(('8.8.8.8', 53), timeout=3)",
        "blocked",
        "blocked: network",
    ),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "blocked", "blocked: process"),
    "os.system": ("import os; os.system('echo pwned')", "blocked", "blocked: process"),
    "subprocess": ("import subprocess; subprocess.run(['sh', '-c', 'echo pwned'])", "blocked", "blocked: process"),
    "ctypes": ("import ctypes; ctypes.CDLL(None).fork()", "blocked", "native code"),
    "allocate 10 GB": ("x = bytearray(10 * 2**30)", "memory", "memory limit"),
    "huge file": ("f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)", "output_limit", "file size"),
}


@pytest.mark.parametrize("name", list(CONTAINED))
def test_attacks_are_contained_with_every_layer(name, secret_file, tmp_path):
    template, status, reason = CONTAINED[name]
    outside = tmp_path / "pwned.txt"
    result = run_untrusted(template.format(secret=str(secret_file), outside=str(outside)), max_file_mb=8)
    assert result.status == status, result
    assert reason in result.reason
    assert "TOP-SECRET" not in result.stdout and "pwned" not in result.stdout
    assert not outside.exists()


KERNEL_CONTAINED = {
    "read a file outside the sandbox": ("print(open({secret!r}).read())", HAS_LANDLOCK),
    "write a file outside the sandbox": ("open({outside!r}, 'w').write('x')", HAS_LANDLOCK),
    "connect to localhost": ("import socket; socket.socket().connect(('127.0.0.1', 22))", HAS_SECCOMP),
    "fork": ("import os\nwhile True:\n    os.fork()", HAS_SECCOMP),
    "kill another process": ("import os; os.kill(1, 9)", HAS_SECCOMP or HAS_LANDLOCK),
    "ctypes fork": ("import ctypes\nassert ctypes.CDLL(None).fork() == -1\nraise PermissionError", HAS_SECCOMP),
}


@pytest.mark.parametrize("name", list(KERNEL_CONTAINED))
def test_kernel_layers_contain_without_the_audit_hook(name, secret_file, tmp_path):
    template, available = KERNEL_CONTAINED[name]
    if not available:
        pytest.skip(f"the kernel layer needed is not available here: {LAYERS}")
    outside = tmp_path / "pwned.txt"
    result = run_untrusted(template.format(secret=str(secret_file), outside=str(outside)), audit_hook=False)
    assert result.status == "blocked", result
    assert "permission denied" in result.reason
    assert "TOP-SECRET" not in result.stdout
    assert not outside.exists()


@pytest.mark.skipif(not (HAS_NETNS or HAS_LANDLOCK), reason="needs a network namespace or Landlock")
def test_network_is_contained_without_audit_hook_and_seccomp():
    code = "import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('127.0.0.1', 22))\nprint('connected')"
    result = run_untrusted(code, audit_hook=False, seccomp=False)
    assert result.status == "blocked" and "connected" not in result.stdout, result


def test_infinite_loop_hits_the_wall_clock_timeout():
    result = run_untrusted("while True:\n    pass", timeout_s=1, cpu_s=30)
    assert (result.status, result.reason) == ("timeout", "timeout after 1 s")


def test_infinite_loop_hits_the_cpu_limit():
    result = run_untrusted("while True:\n    pass", timeout_s=60, cpu_s=1)
    assert (result.status, result.reason) == ("timeout", "cpu time limit (1 s) exceeded")


def test_output_is_capped():
    result = run_untrusted("while True:\n    print('x' * 1000)", max_output_bytes=10_000)
    assert result.status == "output_limit"
    assert len(result.stdout) <= 10_000


def _processes_in_session(session_id: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[1] == "Z":
                continue
            if int(fields[3]) == session_id:  # state, ppid, pgrp, session
                found.append(int(entry))
    return found


def test_no_process_outlives_the_run():
    # Without seccomp and the audit hook the program may fork: the leftover child must be killed with the group.
    code = "import os, time\nprint(os.getsid(0), flush=True)\nif os.fork() == 0:\n    time.sleep(120)\n"
    result = run_untrusted(code, audit_hook=False, seccomp=False, timeout_s=10)
    assert result.status == "ok", result
    session = int(result.stdout.split()[0])
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously: give the kernel a moment
    while _processes_in_session(session) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_in_session(session) == []


def test_exit_is_detected_by_polling_without_pidfd(monkeypatch):
    monkeypatch.setattr(_sandbox_io, "_pidfd", lambda pid: None)  # kernels before 5.3
    code = "import os, time\nprint('parent')\nif os.fork() == 0:\n    time.sleep(120)\n"
    result = run_untrusted(code, audit_hook=False, seccomp=False, timeout_s=10)
    assert (result.status, result.stdout) == ("ok", "parent\n")
    assert run_untrusted("print(input())", stdin="x").stdout == "x\n"


def test_a_failing_run_does_not_affect_concurrent_runs():
    programs = ["print(sum(range(10)))", "while True: pass", "x = bytearray(10 * 2**30)", "print(input())"]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda code: run_untrusted(code, stdin="echo", timeout_s=2), programs))
    assert [r.status for r in results] == ["ok", "timeout", "memory", "ok"]
    assert [results[0].stdout, results[3].stdout] == ["45\n", "echo\n"]


def test_limits_are_validated():
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ConfigError, match="unknown sandbox limit"):
        SandboxLimits.from_mapping({"wall_s": 3})
    assert SandboxLimits.from_mapping({"memory_mb": 256}).memory_mb == 256


def test_seccomp_program_shape():
    program = seccomp_program("x86_64", 1234)
    assert program is not None and len(program) % 8 == 0
    assert seccomp_program("riscv64", 1) is None


def test_a_parent_holding_many_descriptors_still_runs_programs_with_every_layer():
    """A Ray worker holds more open descriptors than a program may (max_open_files): the child's set-up must open
    what it needs (the landlock rule's directory) before lowering the limit, or every run fails to start."""
    limits = SandboxLimits()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(limits.max_open_files + 16)]
    try:
        assert min(held) < limits.max_open_files < max(held)
        result = run_untrusted("print(6 * 7)")
        # the probe too, as if it ran first in such a process
        _, layers = sandbox_module._probe()
    finally:
        for fd in held:
            os.close(fd)
    assert result.status == "ok" and result.stdout == "42\n"
    assert layers == sandbox_layers()
