"""A worker's stdout and stderr go to the file named by ROLL_WORKER_LOG (Python and native writes alike), while
warnings of roll's own loggers still reach the console."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

from roll.protocol import Dispatch, register
from roll.runtime import ENV_WORKER_LOG, Cluster, Worker, WorkerConfig
from roll.runtime.testing import child_env, ship_module_by_value

ship_module_by_value(__name__)

_SCRIPT = """
import logging, os, sys, warnings
from roll.runtime._output import redirect_worker_output
print("before")
sys.stdout.flush()
redirect_worker_output(sys.argv[1], "actor_infer-0")
redirect_worker_output(sys.argv[1], "actor_infer-0")  # a second call changes nothing
print("library print")
os.write(2, b"native stderr write\\n")
warnings.warn("a FutureWarning from a library", FutureWarning)
logging.getLogger("vllm.engine").warning("third-party logger warning")
logging.getLogger("roll.strategies.vllm").warning("roll's own warning")
"""


def test_output_goes_to_the_file_and_roll_warnings_to_the_console(tmp_path: Path) -> None:
    log = tmp_path / "out" / "workers.log"
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(log)], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert done.stdout == "before\n"
    assert done.stderr == "(actor_infer-0) WARNING roll.strategies.vllm: roll's own warning\n"
    text = log.read_text()
    assert text.count("----- actor_infer-0 (pid") == 1
    for expected in ("library print", "native stderr write", "a FutureWarning from a library", "third-party logger"):
        assert expected in text


class NoisyWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def make_noise(self) -> str:
        print(f"noise from rank {self.rank}", flush=True)
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
        logging.getLogger("roll.test").warning("rank %d: roll warning", self.rank)
        sys.stderr.flush()
        return os.environ[ENV_WORKER_LOG]


def test_a_cluster_passes_its_env_and_workers_write_their_output_there(resources, tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    config = WorkerConfig(name="noisy", world_size=2)
    with Cluster("noisy", NoisyWorker, resources, config, env={ENV_WORKER_LOG: str(log)}) as cluster:
        assert cluster.make_noise() == [str(log), str(log)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "noise from rank 1" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    text = log.read_text()
    assert "noise from rank 0" in text and "noise from rank 1" in text
    assert "----- noisy-0 (pid" in text and "----- noisy-1 (pid" in text


def test_system_envs_can_turn_the_redirect_off(resources, tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    config = WorkerConfig(name="loud", world_size=1, system_envs={ENV_WORKER_LOG: ""})
    with Cluster("loud", NoisyWorker, resources, config, env={ENV_WORKER_LOG: str(log)}) as cluster:
        assert cluster.make_noise() == [""]
    assert not log.exists()
