"""The `roll` command reports an error raised inside a worker with that error's own message, hint and exit code."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from roll.pipelines.cli import EXIT_CONFIG, describe_error
from roll.runtime import ConfigError, MissingExtraError, RollError, RpcTimeoutError, WorkerError
from roll.runtime.testing import child_env


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="needs an environment without SGLang")
def test_a_backend_missing_in_a_worker_prints_the_pip_command_and_exits_non_zero(tmp_path):
    env = child_env(RAY_AUTH_MODE="disabled")  # the test's own import path (under Pants roll is not installed)
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "roll.pipelines.cli", "run", "rlvr-rollout-tiny"]
    overrides = ["actor_infer.strategy_args.strategy_name=sglang", f"output_dir={tmp_path / 'out'}"]
    result = subprocess.run(command + overrides, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == EXIT_CONFIG, result.stderr[-3000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error_lines == [
        "error: actor_infer rank 0 failed in initialize(): strategy 'sglang' needs an optional dependency that is "
        "not installed (no module named 'sglang'). Install it with: pip install 'roll-strategies[sglang]'"
    ], result.stderr[-3000:]
    assert "Failed to deserialize" not in result.stderr + result.stdout


def test_exit_codes_and_messages_come_from_the_error_types():
    missing = MissingExtraError("tracker 'wandb'", "roll-pipelines", "wandb")
    assert describe_error(missing) == (str(missing), EXIT_CONFIG)
    assert describe_error(ConfigError("bad field"))[1] == EXIT_CONFIG
    assert describe_error(RpcTimeoutError("actor", "generate", [1], 5.0))[1] == 1
    assert describe_error(RollError("boom")) == ("boom", 1)
    remote = WorkerError("reward", 2, "compute_rewards", "Traceback: ...", cause=ConfigError("reward_kwargs.x: bad"))
    assert describe_error(remote) == ("reward rank 2 failed in compute_rewards(): reward_kwargs.x: bad", EXIT_CONFIG)
    message, code = describe_error(remote, verbose=True)
    assert message.endswith("worker traceback:\nTraceback: ...") and code == EXIT_CONFIG
    # A worker that failed on a bug (not a roll error) shows its traceback and exits 1.
    crash = WorkerError("reward", 0, "compute_rewards", "Traceback: ZeroDivisionError", cause=ZeroDivisionError())
    assert describe_error(crash) == (str(crash), 1) and "ZeroDivisionError" in str(crash)
