"""tools/diagnostics/step_push: a step-wise run's dumped rows scored with the run's advantage settings; the push
toward optimal moves and the mean advantage under row weights and equal episode weights, on a hand-made dump whose
values are worked out here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from roll.pipelines.recipes import recipe_data
from tools.diagnostics.step_push import step_push

START = "PO__\n____\n____\n___G"  # Down is optimal, Right falls into the hole
NEXT = "____\nP___\n____\n___G"  # Down and Right are both optimal


def _row(traj: str, step: int, grid: str, move: str, score: float, episode: float) -> dict:
    return {
        "traj_id": f"FrozenLake_0_0_7_{traj}",
        "step": step,
        "state_hash": grid,
        "episode_scores": episode,
        "prompt": f"<|im_start|>user\n{grid}<|im_end|>\n<|im_start|>assistant\n",
        "response": f"<answer>{move}</answer><|im_end|>",
        "score": score,
    }


def _run(tmp_path: Path, recipe: str) -> Path:
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recipe_data(recipe)))
    rows = [  # one group: episode 0 moves Down then Right and reaches the goal, episode 1 moves Right into the hole
        _row("0", 0, START, "Down", 0.0, 1.0),
        _row("0", 1, NEXT, "Right", 1.0, 1.0),
        _row("1", 0, START, "Right", 0.0, 0.0),
    ]
    (tmp_path / "rollouts" / "step-000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    episodes = [{"traj_id": f"FrozenLake_0_0_7_{traj}", "traj_group_id": "FrozenLake_0_0_7"} for traj in "01"]
    (tmp_path / "rollouts" / "step-000001-episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return tmp_path


def test_push_and_mean_advantage_under_both_weightings(tmp_path):
    found = step_push(_run(tmp_path, "agentic-frozenlake-gigpo-tiny"), 1, 1)
    # the recipe's GiGPO: episode part (score - the group's mean over rows 2/3): +1/3, +1/3, -2/3; step part (returns
    # 0.95, 1, 0; the start state's mean 0.475): +0.475, 0, -0.475. A = (0.808, 0.333, -1.142)
    a = (1 / 3 + 0.475, 1 / 3, -2 / 3 - 0.475)
    # only the start state has a choice: optimal shares 0.5 there, 1 at NEXT
    push = (a[0] * 0.5 + a[2] * -0.5) / 3
    assert found["row weights"]["mean A"] == pytest.approx(sum(a) / 3, abs=1e-5)
    assert found["row weights"]["push"] == pytest.approx(push, abs=1e-5)
    # equal episode weights: 3 / (2 x 2) for episode 0's rows, 3 / (2 x 1) for episode 1's: the short failure weighs more
    weights = (0.75, 0.75, 1.5)
    assert found["equal episode weights"]["mean A"] == pytest.approx(
        sum(w * x for w, x in zip(weights, a)) / 3, abs=1e-5
    )
    assert found["equal episode weights"]["mean A"] < found["row weights"]["mean A"]
    assert found["equal episode weights"]["push"] > 0


def test_a_trajectory_wise_run_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="step-wise"):
        step_push(_run(tmp_path, "agentic-frozenlake-tiny"), 1, 1)
