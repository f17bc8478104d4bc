"""End-to-end GRPO quickstart (`roll run rlvr-tiny`): SFT warm-up, vLLM rollouts, FSDP2 training, math reward."""

from __future__ import annotations

import pytest

from roll.pipelines.tracking import read_metrics

pytestmark = pytest.mark.integration


def test_rlvr_tiny_raises_validation_accuracy_over_the_sft_start(tmp_path, roll):
    out = tmp_path / "rlvr"
    # The recipe runs 40 steps; the first 20 already show the gain (the verifier wants \boxed{} answers, which
    # the warm-up gave only 30% of the time, so greedy decoding starts near 0 and RL moves it up quickly).
    roll(["run", "rlvr-tiny", f"output_dir={out}", "max_steps=20", "eval_steps=10", "save_steps=0"], timeout=2400)
    rows = read_metrics(out / "metrics.jsonl")
    accuracy = {row["step"]: row["val/accuracy"] for row in rows if "val/accuracy" in row}
    assert sorted(accuracy) == [0, 10, 20], accuracy
    assert accuracy[20] >= accuracy[0] + 0.20, accuracy
    trained = [row for row in rows if "actor/loss" in row]
    assert len(trained) == 20
    assert all(row["rollout/samples"] == 16 * 8 for row in trained)
    assert all(row["weight_sync/bytes"] > 0 for row in trained)
    assert (out / "plots").is_dir() and list((out / "plots").glob("*.png"))
