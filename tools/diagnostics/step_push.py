"""How hard does a step-wise FrozenLake run's update push toward optimal moves, under row weights and under equal
episode weights? Reads a run's dumped training rows (``rollout.dump=true``), scores them with the run's own
advantage settings (`compute_agentic_targets` on its config.yaml) and grades every move with the planner.

Usage: python -m tools.diagnostics.step_push RUN_DIR [FIRST LAST]   (RL steps, default 1-60)

Printed per weighting, averaged over the steps:
  push: sum over rows of w * A * (optimal - the optimal share of the row's state group), divided by sum of w: the
        part of the update that moves probability toward optimal moves within a state (0: none);
  mean A: sum of w * A / sum of w (above 0: sampled moves are raised on balance, which sharpens the policy);
  mean |A|: sum of w * |A| / sum of w.
State groups are GiGPO's: (episode group, state hash). Used in docs/results/agentic.md, 36.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from roll.agentic.pipeline import AgenticConfig
from roll.agentic.pipeline.advantage import compute_agentic_targets, episode_weights
from roll.pipelines.config import load_config
from roll.protocol import DataProto
from tools.diagnostics.frozenlake_moves import move_kind

COLUMNS = ("traj_id", "step", "state_hash", "episode_scores")
WEIGHTINGS = ("row weights", "equal episode weights")


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _batch(rows: list[dict], groups: dict[str, str]) -> DataProto:
    """The rows as the advantage needs them; ``groups``: each episode's ``traj_group_id`` (from the episodes file)."""
    columns = {name: [row[name] for row in rows] for name in COLUMNS}
    columns["traj_group_id"] = [groups[row["traj_id"]] for row in rows]
    tensors = {
        "response_mask": torch.ones(len(rows), 1, dtype=torch.long),
        "responses": torch.zeros(len(rows), 1, dtype=torch.long),
        "scores": torch.tensor([row["score"] for row in rows]),
    }
    return DataProto.from_dict(tensors, columns)


def _one_step(rows: list[dict], groups: dict[str, str], config: AgenticConfig) -> dict[str, dict[str, float]]:
    batch = _batch(rows, groups)
    compute_agentic_targets(batch, config)
    advantage = batch.batch["advantages"][:, 0]
    optimal = torch.tensor([float(move_kind(row["prompt"] + row["response"]) == "optimal") for row in rows])
    states: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, row in enumerate(rows):
        states[(groups[row["traj_id"]], row["state_hash"])].append(index)
    share = torch.empty(len(rows))  # the optimal share of each row's state group
    for members in states.values():
        share[members] = optimal[members].mean()
    found = {}
    for name, weights in zip(WEIGHTINGS, (torch.ones(len(rows)), episode_weights(batch))):
        total = weights.sum()
        found[name] = {
            "push": float((weights * advantage * (optimal - share)).sum() / total),
            "mean A": float((weights * advantage).sum() / total),
            "mean |A|": float((weights * advantage.abs()).sum() / total),
        }
    return found


def step_push(run: Path, first: int, last: int) -> dict[str, dict[str, float]]:
    """{"row weights" | "equal episode weights": {"push", "mean A", "mean |A|"}} averaged over the steps."""
    config = load_config(run / "config.yaml")  # the run's own settings, as it saved them
    if not isinstance(config, AgenticConfig) or config.layout != "step":
        raise SystemExit(f"{run}: a step-wise agentic run is needed (env_manager_cls step: one row per move)")
    per_step = []
    for step in range(first, last + 1):
        path = run / "rollouts" / f"step-{step:06d}.jsonl"
        if path.exists():
            episodes = _read(path.with_name(f"step-{step:06d}-episodes.jsonl"))
            groups = {episode["traj_id"]: episode["traj_group_id"] for episode in episodes}
            per_step.append(_one_step(_read(path), groups, config))
    if not per_step:
        raise SystemExit(f"{run}/rollouts has no step-wise dumps for steps {first}-{last} (run with rollout.dump=true)")
    return {
        name: {key: sum(found[name][key] for found in per_step) / len(per_step) for key in per_step[0][name]}
        for name in WEIGHTINGS
    }


def main() -> None:
    run = Path(sys.argv[1])
    first, last = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (1, 60)
    print(f"{run}, RL steps {first}-{last}")
    for name, found in step_push(run, first, last).items():
        print(f"  {name:22s} " + "  ".join(f"{key} {value:+.4f}" for key, value in found.items()))


if __name__ == "__main__":
    main()
