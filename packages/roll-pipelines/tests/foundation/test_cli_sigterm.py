"""SIGTERM (``timeout``, Slurm, Kubernetes) stops a `roll run` the way Ctrl-C does, instead of Ray's native abort."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from roll.pipelines.cli import EXIT_TERMINATED
from roll.runtime.testing import child_env


@pytest.mark.slow
def test_sigterm_stops_a_run_cleanly_with_exit_143(tmp_path):
    env = child_env(RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "roll.pipelines.cli", "run", "rlvr-rollout-tiny", "max_steps=1000"]
    log = tmp_path / "stderr.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*command, f"output_dir={out}", "plots=false"], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp_path
        )
        try:
            deadline = time.monotonic() + 300
            while not (out / "metrics.jsonl").is_file():  # a step ran: Ray, workers and the loop are up
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            os.kill(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert rc == EXIT_TERMINATED, text[-3000:]
    assert "stopped by signal SIGTERM: workers stopped; the last checkpoint (if any) is intact" in text
    assert "SIGTERM received at time" not in text  # Ray's native handler did not take the signal


def test_the_handler_turns_sigterm_into_terminated_and_a_second_one_is_the_default_action():
    from roll.pipelines.base import Terminated, stop_on_sigterm

    previous = stop_on_sigterm()
    try:
        with pytest.raises(Terminated, match="stopped by signal SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode boundary
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
