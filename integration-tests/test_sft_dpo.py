"""End-to-end runs of the tiny SFT and DPO recipes through the `roll` command, read back from metrics.jsonl."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from roll.pipelines.tracking import read_metrics

pytestmark = pytest.mark.integration

TIMING_KEYS = ("time/", "tokens_per_s")


def test_sft_tiny_validation_loss_halves(tmp_path, roll):
    out = tmp_path / "sft"
    roll(["run", "sft-tiny", f"output_dir={out}", "save_steps=0"])
    rows = read_metrics(out / "metrics.jsonl")
    losses = [row["val/loss"] for row in rows if "val/loss" in row]
    assert rows[0]["step"] == 0 and len(losses) >= 3
    assert losses[-1] <= 0.5 * losses[0], losses
    assert sorted(p.name for p in (out / "plots").glob("*.png")) >= ["loss.png"]
    assert (out / "hf_export" / "config.json").is_file()


def test_dpo_tiny_reaches_high_held_out_preference_accuracy(tmp_path, roll):
    out = tmp_path / "dpo"
    roll(["run", "dpo-tiny", f"output_dir={out}", "save_steps=0"])
    rows = read_metrics(out / "metrics.jsonl")
    accuracy = [row["val/accuracy"] for row in rows if "val/accuracy" in row]
    assert abs(accuracy[0] - 0.5) < 0.05
    assert max(accuracy[-2:]) >= 0.9, accuracy


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_KEYS)} for row in rows]


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path, roll, interrupt_roll):
    common = ["run", "sft-tiny", "max_steps=6", "save_steps=3", "eval_steps=3"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    roll([*common, f"output_dir={straight}"])
    # Ctrl-C once step 3's checkpoint is committed; the run stops cleanly with that checkpoint intact.
    code = interrupt_roll([*common, f"output_dir={resumed}"], resumed / "checkpoints" / "step-00000003")
    assert code in (0, 130)
    assert (resumed / "checkpoints" / "step-00000003" / "pipeline_state.json").is_file()
    roll([*common, f"output_dir={resumed}", "resume_from_checkpoint=auto"])
    assert _without_timing(read_metrics(resumed / "metrics.jsonl")) == _without_timing(
        read_metrics(straight / "metrics.jsonl")
    )
    a = load_file(straight / "hf_export" / "model.safetensors")
    b = load_file(resumed / "hf_export" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
