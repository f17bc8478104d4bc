"""The agentic pipeline on ROLL's ``roll_math`` env over a local jsonl of arithmetic questions (nano model, FSDP2
training, HF rollouts): two RL steps and validations; validation asks every question once, in file order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.agentic.pipeline import register_pipelines
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

pytestmark = pytest.mark.integration
MODEL = "tiny://nano?seed=0"
QUESTIONS = [(2, 3), (4, 1), (6, 2), (1, 1), (5, 3), (7, 2)]


def _role(name: str, strategy: str) -> dict:
    return {
        "name": name,
        "model_args": {"model_name_or_path": MODEL, "dtype": "float32"},
        "strategy_args": {"strategy_name": strategy},
    }


@pytest.mark.pipeline_run
def test_agentic_run_on_a_local_math_dataset(ray_env, tmp_path: Path) -> None:
    register_pipelines()
    data_file = tmp_path / "arith.jsonl"
    data_file.write_text(
        "".join(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n" for a, b in QUESTIONS)
    )
    math = {
        "env_type": "roll_math",
        "env_config": {"dataset_name": str(data_file)},
        "max_steps": 1,
        "max_tokens_per_step": 8,
        "agent_system_template": None,
        "agent_template": "{observation}",
    }
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path / "run"),
        "max_steps": 2,
        "eval_steps": 2,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "val_batch_size": 6,
        "sequence_length": 128,
        "rollout": {"env_workers": "local", "dump": True},
        "custom_envs": {"Math": math},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Math"]},
        "val_env_manager": {"num_env_groups": 3, "group_size": 1, "tags": ["Math"]},
        "actor_train": {**_role("math-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("math-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    run_config(load_config(data))
    out = tmp_path / "run"
    metrics = read_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for row in metrics[1:]:
        assert row["rollout/samples"] == 4 and row["rollout/episodes"] == 4
        assert 0.0 <= row["rollout/Math/success"] <= 1.0 and "actor/pg_loss" in row
    validated = [m for m in metrics if "val/episodes" in m]
    assert validated and all(m["val/episodes"] == 6 and 0.0 <= m["val/success"] <= 1.0 for m in validated)
    # validation: the seeds 0..5, so every question once, in file order
    val_files = sorted((out / "rollouts").glob("val-step-*-episodes.jsonl"))
    assert val_files
    for path in val_files:
        episodes = [json.loads(line) for line in path.open()]
        assert sorted(e["seed"] for e in episodes) == list(range(6))
        assert all(e["num_turns"] == 1 and e["end_reason"] == "terminated" for e in episodes)
        prompts = [json.loads(line)["prompt"] for line in path.with_name(path.name.replace("-episodes", "")).open()]
        assert sorted(sum(f"What is {a} + {b}?" in p for p in prompts) for a, b in QUESTIONS) == [1] * 6
    rows = [json.loads(line) for line in (out / "rollouts" / "step-000001.jsonl").open()]
    assert len(rows) == 4
    # a training group of two asks both members the same question
    by_group: dict[str, set[str]] = {}
    for episode in (json.loads(line) for line in (out / "rollouts" / "step-000001-episodes.jsonl").open()):
        by_group.setdefault(episode["traj_group_id"], set()).add(episode["seed"])
    assert len(by_group) == 2 and all(len(seeds) == 1 for seeds in by_group.values())
