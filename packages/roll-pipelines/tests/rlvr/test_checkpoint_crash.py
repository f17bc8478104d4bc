"""SIGKILL of the driver while a checkpoint is being saved, then ``resume_from_checkpoint=auto``.

The crashing run is a separate driver process joined to this test's Ray (so Ray reaps its actors when it dies). It is
killed inside the save of checkpoint 2, after the training role wrote its files. The previous checkpoint (1) must be
intact (its manifest verifies), and the resumed run must log, step for step, the metrics of an uninterrupted run:
sampling seeds, data cursors, optimizer and RNG states all come back. Two steps with a checkpoint after each are the
fewest that leave a committed checkpoint, a killed save and a step trained after the resume (5 steps in 3 runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from roll.pipelines.checkpoint import verify_manifest
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics
from roll.runtime.testing import child_env

DRIVER = Path(__file__).with_name("checkpoint_crash_driver.py")
MODEL = "tiny://nano?seed=0"
# Wall-clock measurements differ between any two runs; everything else must be equal.
_TIMING = ("time/", "throughput/", "weight_sync/")


def _overrides(out: Path, names: str) -> list[str]:
    values = {
        "output_dir": out,
        "max_steps": 2,
        "save_steps": 1,
        "eval_steps": 0,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "response_length": 8,
        "prompt_length": 48,
        "val_batch_size": 8,
        "actor_train.name": f"{names}-train",
        "actor_train.model_args.model_name_or_path": MODEL,
        "actor_train.training_args.per_device_train_batch_size": 4,
        "actor_train.data_args.file_name": "synthetic://arithmetic_prompts?n=64&seed=1&split=train",
        "actor_train.data_args.eval_file_name": "synthetic://arithmetic_prompts?n=8&seed=1&split=eval",
        "actor_infer.name": f"{names}-infer",
        "actor_infer.model_args.model_name_or_path": MODEL,
        "actor_infer.generating_args.num_return_sequences": 4,
        "actor_infer.generating_args.temperature": 1.0,
        "actor_infer.strategy_args.strategy_name": "hf_infer",
        "actor_infer.strategy_args.strategy_config": "{}",
        "rewards.math.name": f"{names}-reward",
    }
    return [f"{k}={v}" for k, v in values.items()]


def _comparable(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith(_TIMING)} for m in metrics]


def _wait_until_gone(names: list[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            assert time.monotonic() < deadline, f"actor {name} outlived its killed driver"
            time.sleep(0.5)


@pytest.mark.pipeline_run
def test_driver_sigkilled_during_a_checkpoint_save_resumes_to_identical_metrics(tmp_path: Path, ray_env: None) -> None:
    run_config(load_config("rlvr-tiny", _overrides(tmp_path / "uninterrupted", "ckref")))
    expected = _comparable(read_metrics(tmp_path / "uninterrupted" / "metrics.jsonl"))

    out, marker = tmp_path / "crashed", tmp_path / "in-save"
    env = child_env(RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), json.dumps(_overrides(out, "ckcrash")), "2", str(marker)], env=env
    )
    try:
        deadline = time.monotonic() + 900
        while not marker.exists():
            assert driver.poll() is None, f"the driver exited with {driver.returncode} before the save"
            assert time.monotonic() < deadline, "the driver never reached the checkpoint save"
            time.sleep(0.2)
        assert (out / "checkpoints" / ".tmp-step-00000002" / "ckcrash-train").is_dir()  # the role wrote its part
        os.kill(driver.pid, signal.SIGKILL)
        assert driver.wait(timeout=60) == -signal.SIGKILL
    finally:
        if driver.poll() is None:
            driver.kill()
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-")) == ["step-00000001"]
    assert verify_manifest(checkpoints / "step-00000001") is None
    _wait_until_gone([f"ckcrash-{role}-0" for role in ("train", "infer", "reward")])

    run_config(load_config("rlvr-tiny", [*_overrides(out, "ckcrash"), "resume_from_checkpoint=auto"]))
    assert not (checkpoints / ".tmp-step-00000002").exists()
    resumed = _comparable(read_metrics(out / "metrics.jsonl"))
    assert [m["step"] for m in resumed] == [m["step"] for m in expected] == [0, 1, 2]
    for want, got in zip(expected, resumed):
        assert got.keys() == want.keys(), f"step {want['step']}"
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7), f"step {want['step']} {key}"
