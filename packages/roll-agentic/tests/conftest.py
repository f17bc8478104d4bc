"""Shared fixtures: a tiny local tokenizer (no hub) and one Ray session for the tests that need actors."""

from __future__ import annotations

import pytest

from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)
from roll.strategies.testing import default_corpus, make_tokenizer

# Text of the games, so the tiny BPE tokenizer encodes observations and actions in few tokens.
_AGENTIC_TEXT = [
    "<answer>Up</answer> <answer>Down</answer> <answer>Left</answer> <answer>Right</answer>",
    "<think>the goal is near</think> Turn 1: Observation: You have 3 actions left. Decide the next action:",
    '<tool_call>{"name": "python_code", "arguments": {"code": "print(1 + 2)"}}</tool_call>',
    "P___ _O__ __G_ #### #_X_# #O_P# What is 12 * 34?",
]


@pytest.fixture(scope="session")
def tokenizer():
    """A byte-level BPE tokenizer (vocab 512) with ChatML special tokens and chat template."""
    return make_tokenizer(default_corpus(0, 400) + _AGENTIC_TEXT * 50, 512)


@pytest.fixture(scope="session")
def ray_session():
    from roll.runtime.testing import local_ray

    with local_ray(num_cpus=32) as info:
        yield info


@pytest.fixture(scope="session")
def resources(ray_session):
    from roll.runtime import ResourceManager

    return ResourceManager()


def _runs_of_ones(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.fixture(scope="session")
def mask_runs():
    """``[start, end)`` of each maximal run of 1s in a 0/1 list (e.g. the assistant turns of a loss mask)."""
    return _runs_of_ones


@pytest.fixture
def openreward_server(monkeypatch):
    """A :class:`~roll.agentic.env.openreward_testing.FakeOpenRewardServer` (environment ``test/Echo``, 5 tasks) that
    the ``openreward`` SDK of this process talks to, with its API key set."""
    pytest.importorskip("openreward")  # per test: a module skipped whole collects nothing, a failure under Pants
    from roll.agentic.env.openreward_testing import FAKE_API_KEY, FakeOpenRewardServer

    with FakeOpenRewardServer({"test/Echo": 5}) as fake:
        for name, value in fake.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("OPENREWARD_API_KEY", FAKE_API_KEY)
        yield fake


@pytest.fixture(scope="module")
def sokoban_mcp_server(tmp_path_factory):
    """``python -m roll.agentic.env.sokoban_mcp_server`` on a free localhost port for a module's tests: its base URL
    (SSE at ``/sse``, streamable HTTP at ``/mcp``). Stopped after the module."""
    pytest.importorskip("mcp")  # per test: a module skipped whole collects nothing, a failure under Pants
    import os
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path_factory.mktemp("sokoban-mcp") / "server.log"
    # the child imports roll from where this process does (an editable checkout, a worktree, Pants' sandbox)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "roll.agentic.env.sokoban_mcp_server", "--port", str(port)]
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=out, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Sokoban MCP server did not start:\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
