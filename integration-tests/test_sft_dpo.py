"""End-to-end runs of the tiny SFT and DPO recipes through the `roll` command, read back from metrics.jsonl."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from roll.pipelines.tracking import read_metrics

pytestmark = pytest.mark.integration

TIMING_KEYS = ("time/", "tokens_per_s")


def _series(rows: list[dict], key: str) -> dict[int, float]:
    return {row["step"]: row[key] for row in rows if key in row}


@pytest.mark.learning
def test_sft_tiny_learns_to_answer_held_out_problems(tmp_path, roll):
    out = tmp_path / "sft"
    done = roll(["run", "sft-tiny", f"output_dir={out}", "save_steps=0"])
    rows = read_metrics(out / "metrics.jsonl")
    correct, answer_loss = _series(rows, "val/correct"), _series(rows, "val/answer_loss")
    assert min(correct) == 0 and len(correct) >= 3  # step 0 and several validations
    # Greedy answers to held-out problems (no commuted twin in training), graded whatever their format.
    last = max(correct)
    assert correct[0] <= 0.05 and correct[last] >= 0.5, correct
    assert _series(rows, "val/format")[last] >= 0.9
    # The answer tokens carry the skill: their loss falls too, not only the template's.
    assert answer_loss[last] <= 0.5 * answer_loss[0], answer_loss
    assert {"loss.png", "skill.png"} <= {p.name for p in (out / "plots").glob("*.png")}
    assert (out / "hf_export" / "config.json").is_file()
    assert "held-out before/after" in done.stdout


@pytest.mark.learning
def test_dpo_tiny_prefers_correct_answers_on_held_out_pairs(tmp_path, roll):
    out = tmp_path / "dpo"
    roll(["run", "dpo-tiny", f"output_dir={out}", "save_steps=0"])
    rows = read_metrics(out / "metrics.jsonl")
    accuracy, ties = _series(rows, "val/accuracy"), _series(rows, "val/ties")
    # Before training the policy is the reference: every pair is a tie, and a tie is not a preference.
    assert accuracy[0] == 0.0 and ties[0] == 1.0
    last = max(accuracy)
    assert accuracy[last] >= 0.8 and ties[last] <= 0.05, accuracy
    # Held-out generation accuracy is measured before and after, and reported as a change.
    changes = _series(rows, "val/correct_change")
    assert changes[0] == 0.0 and last in changes


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_KEYS)} for row in rows]


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path, roll, interrupt_roll):
    common = ["run", "sft-tiny", "max_steps=6", "save_steps=3", "eval_steps=3", "val_generation_rows=16"]
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
