"""Step-wise (GiGPO) FrozenLake learns on held-out layouts: `roll run agentic-frozenlake-gigpo-tiny`, shortened.

The recipe's gate is +20 points of `val/success` in 15 minutes of RL; two 15-minute runs gave +17.2 and +12.5
(docs/results/agentic.md, 17a-17b). This check runs 150 RL steps (about 8 minutes on an idle 2-core machine, plus
the 4-minute warm-up) with looser bounds, and grades every validation move against its board
(tools/diagnostics/frozenlake_moves), a measure with far less sampling noise than 128 episodes' success:

* the warm-up's clone reads the board: its moves are optimal well above a uniform mover's rate on the same boards;
* RL raises held-out success by 5 points and the optimal-move share by 4 (the two gate runs at step 150: +13.3 / +6.2
  points of success; this check's first run: +20.3 points, optimal moves 0.718 -> 0.844); the answer format stays.

Run with `pytest -m learning integration-tests/test_agentic_learning.py` (13.5 minutes on the idle machine; not in
`./tools/dev test`).
"""

from __future__ import annotations

import pytest

from roll.pipelines.tracking import read_metrics
from tools.diagnostics.frozenlake_moves import report

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.learning]
STEPS = 150


def test_gigpo_frozenlake_raises_heldout_success_and_move_quality(tmp_path, roll):
    out = tmp_path / "gigpo"
    args = [f"output_dir={out}", f"max_steps={STEPS}", f"eval_steps={STEPS}"]
    roll(["run", "agentic-frozenlake-gigpo-tiny", *args, "export_hf=false", "plots=false", "rollout.dump=true"])
    rows = read_metrics(out / "metrics.jsonl")
    success = {row["step"]: row["val/success"] for row in rows if "val/success" in row}
    formatted = {row["step"]: row["val/format"] for row in rows if "val/format" in row}
    assert sorted(success) == [0, STEPS], success
    start, end = (report(out / "rollouts" / f"val-step-{step:06d}.jsonl") for step in (0, STEPS))
    assert start["moves"] > 300 and end["moves"] > 300, (start, end)
    assert start["optimal"] >= start["random_optimal"] + 0.2, start
    assert end["optimal"] >= start["optimal"] + 0.04, (start, end)
    assert success[STEPS] >= success[0] + 0.05, success
    assert min(formatted.values()) >= 0.9, formatted
