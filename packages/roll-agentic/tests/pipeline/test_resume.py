"""Resuming an ``agentic`` run from a checkpoint continues the uninterrupted run exactly (greedy rollouts): the same
env seeds (the training scheduler's cursor), the same point of a decaying LR schedule, the reference on the same
warmed-up clone (with ``warmup.cache: false`` the warm-up is played again for it), and no step logged twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.pipeline import register_pipelines
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

pytestmark = pytest.mark.integration
MODEL = "tiny://nano?seed=0"
LAKE = {
    "env_type": "frozen_lake",
    # the format penalty gives every RL step a non-zero loss (the nano model never answers in format)
    "env_config": {"size": 3, "grid_vocab": {}, "env_instruction": "FrozenLake.", "format_penalty": -0.1},
    "max_steps": 2,
    "max_tokens_per_step": 8,
    "agent_system_template": None,
    "agent_template": "{observation}",
}


def _role(name: str, strategy: str) -> dict[str, Any]:
    return {
        "name": name,
        "model_args": {"model_name_or_path": MODEL, "dtype": "float32"},
        "strategy_args": {"strategy_name": strategy},
    }


def _run(out: Path, **extra: Any) -> list[dict[str, Any]]:
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(out),
        "adv_estimator": "reinforce",
        "max_steps": 3,
        "eval_steps": 3,
        "save_steps": 1,
        "max_ckpt_to_keep": 3,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local", "dump": True},
        "kl": {"use_loss": True, "loss_coef": 0.1},
        "warmup": {
            "steps": 1,
            "episodes_per_step": 4,
            "learning_rate": 1e-3,
            "cache": False,
            "policy": "roll.agentic.policy.mock:RandomActionPolicy",
            "policy_kwargs": {"actions": ["Up", "Down", "Left", "Right"]},
        },
        "custom_envs": {"Lake": LAKE},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
        "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["Lake"]},
        "actor_train": {
            **_role("resume-train", "fsdp2_train"),
            "training_args": {"learning_rate": 1e-4, "lr_scheduler_type": "cosine"},
        },
        "reference": _role("resume-ref", "hf_infer"),
        # greedy rollouts, so that two runs from the same weights play the same episodes
        "actor_infer": {
            **_role("resume-infer", "hf_infer"),
            "generating_args": {"max_new_tokens": 8, "temperature": 0},
        },
        **extra,
    }
    run_config(load_config(data))
    return read_metrics(out / "metrics.jsonl")


def _episodes(out: Path, step: int) -> list[tuple[str, int]]:
    lines = (out / "rollouts" / f"step-{step:06d}-episodes.jsonl").read_text().splitlines()
    return sorted((row["traj_id"], row["seed"]) for row in map(json.loads, lines))


def _state(out: Path, step: int) -> dict[str, Any]:
    return json.loads((out / "checkpoints" / f"step-{step:08d}" / "pipeline_state.json").read_text())


def test_a_resumed_run_continues_the_uninterrupted_one(ray_env, tmp_path: Path):
    register_pipelines()
    full = _run(tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoints" / "step-00000001"
    resumed = _run(tmp_path / "resumed", resume_from_checkpoint=str(checkpoint))

    assert [row["step"] for row in full] == [0, 1, 2, 3]
    assert [row["step"] for row in resumed] == [2, 3]  # nothing before the checkpoint is played or logged again
    assert _state(tmp_path / "full", 1)["data_state"]["next_episode"] == [1, 1]  # one round per group so far
    for step, row in zip((2, 3), resumed, strict=True):
        expected = full[step]
        # the scheduler's cursor: the same env seeds, in the same groups
        assert _episodes(tmp_path / "resumed", step) == _episodes(tmp_path / "full", step)
        # the LR schedule's position (cosine: the rate falls step by step)
        assert row["actor/lr"] == pytest.approx(expected["actor/lr"], rel=1e-6)
        # the reference on the same clone (the warm-up played again), the actor on the checkpoint's weights
        for key in ("actor/kl_loss", "actor/pg_loss", "actor/log_prob"):
            assert row[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-8), (step, key)
    assert full[3]["actor/lr"] < full[2]["actor/lr"] < full[1]["actor/lr"]
    assert full[2]["actor/kl_loss"] > 1e-6  # the actor moved off the clone: the KL check above has teeth
    assert resumed[-1]["val/success"] == full[-1]["val/success"]
    assert _state(tmp_path / "resumed", 3)["data_state"] == _state(tmp_path / "full", 3)["data_state"]
