from __future__ import annotations

import json
import random

import pytest
import torch

from roll.pipelines.checkpoint import CheckpointManager, PipelineState, verify_manifest
from roll.runtime import ConfigError


def test_commit_is_atomic_and_latest_wins(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt", max_to_keep=2)
    for step in (1, 2, 3):
        folder = manager.begin(step)
        (folder / "role").mkdir()
        (folder / "role" / "weights.bin").write_bytes(b"x" * step)
        manager.commit(step, PipelineState(step=step, data_state={"cursor": step * 10}))
    assert [p.name for p in manager.complete()] == ["step-00000002", "step-00000003"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step-00000003"
    assert manager.resolve("auto").name == "step-00000003"
    state = manager.load_state(manager.resolve("auto"))
    assert state.step == 3 and state.data_state == {"cursor": 30}


def test_a_crash_mid_save_leaves_the_last_good_checkpoint(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    manager.begin(5)
    manager.commit(5, PipelineState(step=5))
    half_written = manager.begin(6)
    (half_written / "partial").write_text("interrupted")
    # Process dies here. A new run sees only step 5 and removes the leftovers.
    assert manager.resolve("auto").name == "step-00000005"
    with caplog.at_level("WARNING"):
        assert [p.name for p in manager.clean_incomplete()] == [".tmp-step-00000006"]
    assert not half_written.exists()
    assert "checkpoint 6 was cut short" in caplog.text  # why the run resumes from step 5, not 6


def test_resolve_rejects_incomplete_paths_and_accepts_false(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.resolve(False) is None and manager.resolve("auto") is None
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        manager.resolve(str(tmp_path / "nope"))


def test_driver_rng_is_restored(tmp_path):
    manager = CheckpointManager(tmp_path)
    random.seed(1)
    torch.manual_seed(1)
    manager.begin(1)
    manager.commit(1, PipelineState(step=1))
    expected = (random.random(), torch.rand(1).item())
    random.seed(99)
    torch.manual_seed(99)
    manager.load_state(manager.latest())
    assert (random.random(), torch.rand(1).item()) == expected


def test_manifest_lists_every_file_and_a_damaged_checkpoint_is_skipped(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=3)
    for step in (1, 2):
        folder = manager.begin(step)
        (folder / "actor").mkdir()
        (folder / "actor" / "model.pt").write_bytes(b"w" * 100)
        manager.commit(step, PipelineState(step=step))
    manifest = json.loads((tmp_path / "step-00000002" / "manifest.json").read_text())["files"]
    assert manifest["actor/model.pt"] == 100 and {"pipeline_state.json", "driver_rng.pkl"} <= set(manifest)
    (tmp_path / "step-00000002" / "actor" / "model.pt").write_bytes(b"w" * 10)  # cut short after the fact
    assert verify_manifest(tmp_path / "step-00000002") is not None
    assert manager.resolve("auto").name == "step-00000001"
    with pytest.raises(ConfigError, match="wrong size"):
        manager.resolve(str(tmp_path / "step-00000002"))
