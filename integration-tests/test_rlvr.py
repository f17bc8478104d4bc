"""End-to-end GRPO quickstart (`roll run rlvr-tiny`): SFT warm-up, vLLM rollouts, FSDP2 training, math reward."""

from __future__ import annotations

import pytest

from roll.pipelines.tracking import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.learning]


def _series(rows: list[dict], key: str) -> dict[int, float]:
    return {row["step"]: row[key] for row in rows if key in row}


def test_rlvr_tiny_raises_held_out_correctness_not_format(tmp_path, roll):
    out = tmp_path / "rlvr"
    # A shorter run than the recipe's, with a looser bound than the quick start's +15 points.
    done = roll(["run", "rlvr-tiny", f"output_dir={out}", "max_steps=10", "eval_steps=5", "save_steps=0"], timeout=3600)
    rows = read_metrics(out / "metrics.jsonl")
    correct, formatted = _series(rows, "val/correct"), _series(rows, "val/format")
    assert sorted(correct) == [0, 5, 10], correct
    # The warm-up already answers in the requested format, so what GRPO adds is correct answers.
    assert formatted[0] >= 0.9 and correct[0] <= 0.9, (correct, formatted)
    assert correct[10] >= correct[0] + 0.10, correct
    trained = [row for row in rows if "actor/loss" in row]
    assert len(trained) == 10
    assert all(row["rollout/samples"] == 16 * 8 for row in trained)
    assert all(row["weight_sync/bytes"] > 0 for row in trained)
    assert (out / "plots" / "skill.png").is_file()
    assert "held-out before/after" in done.stdout and "correct (answer right, any format)" in done.stdout
