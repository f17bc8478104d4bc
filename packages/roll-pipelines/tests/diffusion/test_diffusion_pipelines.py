"""The diffusion recipes run end to end (Ray roles, FSDP2 training of a diffusers model, hf_infer/fsdp2_infer
teachers, the reward role) for a short time, and their learning measure moves the right way on held-out data:

* Reward-FL: reward on held-out conditions (fixed noise) rises, while the held-out denoising loss stays near;
* DMD: the one-step generator's Frechet distance to held-out images falls towards the 50-step teacher's;
* ODE distillation: the 4-step student's MSE to the teacher's 50-step outputs of held-out noise falls.

Bounds are looser than the recipes' targets (docs/results/diffusion.md): the runs are a fraction of a recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.learning]


def _run(recipe: str, out: Path, teacher: str, roles: list[str], **overrides: Any) -> list[dict[str, Any]]:
    changes = {"output_dir": str(out), "plots": True, **overrides}
    changes.update({f"{role}.model_args.model_name_or_path": teacher for role in roles})
    run_config(load_config(recipe, [f"{k}={v}" for k, v in changes.items()]))
    return [row for row in read_metrics(out / "metrics.jsonl") if any(k.startswith("val/") for k in row)]


def test_reward_fl_raises_heldout_reward_and_keeps_quality(ray_env, tmp_path):
    rows = _run(
        "diffusion-reward-fl-tiny",
        tmp_path,
        ray_env,
        ["actor_train"],
        max_steps=25,
        eval_steps=0,
        export_hf="true",
        **{"evaluation.num_samples": 64},
    )
    start, end = rows[0], rows[-1]
    assert (start["step"], end["step"]) == (0, 25)
    assert end["val/reward"] > 1.10 * start["val/reward"], (start["val/reward"], end["val/reward"])
    assert abs(end["val/denoising_rel_change"]) < 0.25, end["val/denoising_rel_change"]
    assert (tmp_path / "plots" / "samples_step0025.png").is_file()
    assert (tmp_path / "hf_export" / "scheduler" / "scheduler_config.json").is_file()


def test_dmd_one_step_generator_moves_towards_the_teacher(ray_env, tmp_path):
    rows = _run(
        "diffusion-dmd-tiny",
        tmp_path,
        ray_env,
        ["generator", "fake_score", "teacher"],
        max_steps=60,
        eval_steps=0,
        export_hf="false",
        **{"evaluation.num_samples": 128, "dmd.regression_pairs": 128},
    )
    start, end = rows[0], rows[-1]
    assert end["val/fd"] < 0.7 * start["val/fd"], (start["val/fd"], end["val/fd"])


def test_ode_distill_student_approaches_the_teacher_on_heldout_noise(ray_env, tmp_path):
    rows = _run(
        "diffusion-ode-distill-tiny",
        tmp_path,
        ray_env,
        ["student", "teacher"],
        max_steps=60,
        eval_steps=0,
        export_hf="false",
        **{"evaluation.num_samples": 64, "ode.num_trajectories": 256},
    )
    start, end = rows[0], rows[-1]
    assert end["val/mse_ratio"] < 0.7, (start["val/mse_to_teacher"], end["val/mse_to_teacher"])
