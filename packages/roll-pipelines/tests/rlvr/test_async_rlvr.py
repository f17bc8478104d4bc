"""Async RLVR on a nano model: bounded staleness, partial rollouts, and inference engines that die or hang.

Each run has two one-rank hf_infer engines, ratio-bounded per-request generation and rollout dumps, from which
prompt accounting is checked exactly: every step trains 4 whole groups of 4 samples, no group twice.

* SIGKILL of an engine's process (found by its Ray process title, ``ray::InferWorker.generate_requests``) while it
  generates: the engine is restarted, its requests are re-issued, and the run finishes every step.
* A hung engine (SIGSTOP: alive, silent) is detected by ``request_timeout_s``, killed and replaced likewise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics
from roll.runtime._worker import ENV_CLUSTER_NAME

GROUPS, N = 4, 4
MODEL = "tiny://nano?seed=0"
_RUNS = iter(range(1000))


def _config(out: Path, **changes: Any) -> Any:
    run = next(_RUNS)
    overrides = {
        "max_steps": 2,
        "eval_steps": 0,
        "save_steps": 0,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": GROUPS,
        "response_length": 8,
        "prompt_length": 48,
        "val_batch_size": 8,
        "actor_train.name": f"atrain-{run}",
        "actor_train.model_args.model_name_or_path": MODEL,
        "actor_train.training_args.per_device_train_batch_size": 4,
        "actor_train.data_args.file_name": "synthetic://arithmetic_prompts?n=64&seed=1&split=train",
        "actor_train.data_args.eval_file_name": "synthetic://arithmetic_prompts?n=8&seed=1&split=eval",
        "actor_infer.name": f"ainfer-{run}",
        "actor_infer.model_args.model_name_or_path": MODEL,
        "actor_infer.generating_args.num_return_sequences": N,
        "actor_infer.strategy_args.strategy_name": "hf_infer",
        "actor_infer.strategy_args.strategy_config": "{}",
        "rewards.math.name": f"areward-{run}",
        **changes,
    }
    return load_config("rlvr-tiny", [f"output_dir={out}", *(f"{k}={v}" for k, v in overrides.items())])


class EngineSignaller(threading.Thread):
    """Sends ``sig`` once to one of this run's engine processes while it runs ``generate_requests``."""

    def __init__(self, engine_prefix: str, sig: int) -> None:
        super().__init__(daemon=True)
        self.engine_prefix, self.sig = engine_prefix, sig
        self.pids: list[int] = []
        self.stop = threading.Event()

    def _busy_engine(self) -> int | None:
        """The pid of this run's engine process while it generates (Ray sets the process title), read from /proc."""
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    title = f.read().replace(b"\0", b" ").decode(errors="replace")
                if not title.startswith("ray::InferWorker.generate_requests"):
                    continue
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    env = dict(
                        item.split("=", 1) for item in f.read().decode(errors="replace").split("\0") if "=" in item
                    )
            except OSError:
                continue  # the process ended, or is not ours to read
            if env.get(ENV_CLUSTER_NAME, "").startswith(self.engine_prefix):
                return int(entry.name)
        return None

    def run(self) -> None:
        while not self.stop.is_set() and not self.pids:
            pid = self._busy_engine()
            if pid is not None:
                os.kill(pid, self.sig)
                self.pids.append(pid)
            time.sleep(0.05)

    def cleanup(self) -> None:
        self.stop.set()
        for pid in self.pids:  # a stopped engine the pool failed to kill must not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _async_run(
    out: Path, sig: int, ratio: int, steps: int, **changes: Any
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], int]:
    engines = f"asyncinfer{os.getpid()}x{sig}"
    config = _config(
        out,
        max_steps=steps,
        rollout_dump=True,
        async_generation_ratio=ratio,
        **{
            "actor_infer.name": engines,
            "actor_infer.world_size": 2,
            "asynchrony.partial_rollout_tokens": 3,
            "asynchrony.requests_per_call": 2,
            **changes,
        },
    )
    signaller = EngineSignaller(f"{engines}-e", sig)
    signaller.start()
    try:
        run_config(config)
    finally:
        signaller.cleanup()
    dumps = [
        [json.loads(line) for line in (out / "rollouts" / f"step-{s:06d}.jsonl").read_text().splitlines()]
        for s in range(1, steps + 1)
    ]
    return read_metrics(out / "metrics.jsonl"), dumps, len(signaller.pids)


def _check_accounting(metrics: list[dict[str, Any]], dumps: list[list[dict[str, Any]]], bound: int) -> None:
    steps = len(dumps)
    assert [m["step"] for m in metrics] == list(range(steps + 1))
    seen: set[int] = set()
    for rows in dumps:
        groups = Counter(row["group_index"] for row in rows)
        assert len(rows) == GROUPS * N and set(groups.values()) == {N}  # whole groups only
        assert not seen & set(groups), "a group was trained on twice"
        seen |= set(groups)
        assert max(row["staleness"] for row in rows) <= bound and min(row["staleness"] for row in rows) >= 0
    for m in metrics[1:]:
        assert m["rollout/samples"] == GROUPS * N
        assert m["async/batch_staleness_max"] <= bound
        accounted = m["async/consumed_groups"] + m["async/discarded_groups"]
        accounted += m["async/ready_groups"] + m["async/generating_groups"]
        assert accounted == m["async/admitted_groups"]  # no prompt lost or counted twice
    assert metrics[-1]["async/consumed_groups"] == steps * GROUPS


@pytest.mark.pipeline_run
def test_engine_killed_mid_step_is_restarted_and_its_requests_reissued(tmp_path: Path, ray_env: None) -> None:
    metrics, dumps, signalled = _async_run(tmp_path / "killed", signal.SIGKILL, 1, steps=3)
    assert signalled == 1
    _check_accounting(metrics, dumps, bound=1)
    last = metrics[-1]
    assert last["engines/restarts"] == 1.0
    assert last["async/reissued_requests"] >= 1
    # whether a segment was left across a weight sync here is timing (0 in one final check): test_replay.py's
    # test_a_sample_continued_across_a_weight_sync_counts_and_keeps_both_versions drives that case by hand
    assert max(m["async/batch_staleness_max"] for m in metrics[1:]) == 1.0  # the bound was used, never passed


@pytest.mark.pipeline_run
def test_hung_engine_is_timed_out_replaced_and_the_run_completes(tmp_path: Path, ray_env: None) -> None:
    metrics, dumps, signalled = _async_run(
        tmp_path / "hung", signal.SIGSTOP, 0, steps=2, **{"asynchrony.request_timeout_s": 20}
    )
    assert signalled == 1
    _check_accounting(metrics, dumps, bound=0)
    assert metrics[-1]["engines/restarts"] == 1.0
    assert metrics[-1]["async/reissued_requests"] >= 1


@pytest.mark.parametrize("ratio", [0, 2])
def test_async_config_round_trips_and_maps_the_flat_key(ratio: int, tmp_path: Path) -> None:
    config = _config(tmp_path, async_generation_ratio=ratio)
    assert config.asynchrony.generation_ratio == ratio and config.asynchrony.enabled
