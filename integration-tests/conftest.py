from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)

# Tests here import the diagnostics and benchmarks under tools/: `python -m pytest` (./tools/dev) puts the repository
# root on the path, a plain `pytest` does not.
REPO = str(Path(__file__).resolve().parents[1])
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(scope="session")
def roll_env(tmp_path_factory) -> dict[str, str]:
    """Environment for `roll` subprocesses: a private asset cache shared by the session's runs."""
    cache = tmp_path_factory.mktemp("roll-cache")
    return dict(os.environ, ROLL_CACHE_DIR=str(cache), RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")


def _roll(args: list[str], env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run the `roll` command of this interpreter's environment; fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "roll.pipelines.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(
            f"roll {' '.join(args)} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
        )
    return done


def _interrupt_when(args: list[str], env: dict[str, str], ready: Path, timeout: float = 1200) -> int:
    """Start `roll`, send Ctrl-C (SIGINT) once ``ready`` exists, and return its exit code."""
    process = subprocess.Popen(
        [sys.executable, "-m", "roll.pipelines.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            output = process.stdout.read() if process.stdout else ""
            process.kill()
            raise AssertionError(f"roll finished or timed out before {ready} appeared:\n{output[-6000:]}")
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode


@pytest.fixture(scope="session")
def roll(roll_env):
    """``roll(["run", "sft-tiny", ...])``: run the CLI in a subprocess; raises with its output on failure."""
    return lambda args, timeout=1800: _roll(args, roll_env, timeout)


@pytest.fixture(scope="session")
def interrupt_roll(roll_env):
    """``interrupt_roll(args, ready_path)``: start the CLI, Ctrl-C it once ``ready_path`` exists, return the exit code."""
    return lambda args, ready, timeout=1200: _interrupt_when(args, roll_env, ready, timeout)


def _write_scripted_rollouts(
    path: Path, make_env: Callable[[], Any], policy: Callable[[str, random.Random], str], episodes: int, turns: int
) -> Path:
    rng = random.Random(0)
    with path.open("w") as sink:
        for seed in range(episodes):
            env = make_env()
            observation, _ = env.reset(seed)
            prompt, response = f"Turn 1:\n{observation}\n", ""
            for turn in range(2, turns + 2):
                answer = policy(prompt + response, rng)
                observation, _, terminated, truncated, _ = env.step(answer)
                response += f"{answer}\nTurn {turn}:\n{observation}\n"
                if terminated or truncated:
                    break
            sink.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    return path


@pytest.fixture
def scripted_rollouts():
    """``scripted_rollouts(path, make_env, policy, episodes, turns)``: a rollout dump (``prompt``/``response`` rows,
    turns as the trajectory-wise manager writes them) of ``policy(text, rng)`` playing ``episodes`` episodes (seeds
    0, 1, ...) of up to ``turns`` moves on fresh envs; input for the move-grading diagnostics, with a known policy
    behind it. Returns ``path``."""
    return _write_scripted_rollouts
