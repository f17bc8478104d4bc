"""The RLVR pipeline with a Ulysses actor: 2 fsdp2_train workers in one sequence-parallel group (one data-parallel
rank) train exactly as 1 worker without it, inside the pipeline's own worker layout (dispatch, weight sync)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

MODEL = "tiny://nano?seed=0"


def _run(out: Path, name: str, **changes: Any) -> list[dict[str, Any]]:
    overrides = {
        "max_steps": 1,
        "eval_steps": 0,
        "save_steps": 0,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "response_length": 8,
        "prompt_length": 48,
        "val_batch_size": 4,
        "actor_train.name": f"train-{name}",
        "actor_train.model_args.model_name_or_path": MODEL,
        "actor_train.training_args.per_device_train_batch_size": 4,
        "actor_train.data_args.file_name": "synthetic://arithmetic_prompts?n=64&seed=1&split=train",
        "actor_train.data_args.eval_file_name": "synthetic://arithmetic_prompts?n=4&seed=1&split=eval",
        "actor_infer.name": f"infer-{name}",
        "actor_infer.model_args.model_name_or_path": MODEL,
        "actor_infer.generating_args.num_return_sequences": 4,
        "actor_infer.strategy_args.strategy_name": "hf_infer",
        "actor_infer.strategy_args.strategy_config": "{}",
        "rewards.math.name": f"reward-{name}",
        **changes,
    }
    config = load_config("rlvr-tiny", [f"output_dir={out}", *(f"{k}={v}" for k, v in overrides.items())])
    run_config(config)
    return read_metrics(out / "metrics.jsonl")


@pytest.mark.pipeline_run
@pytest.mark.slow
def test_a_ulysses_actor_trains_like_one_worker(tmp_path: Path, ray_env: None) -> None:
    # An untrained model earns no reward, so the advantages are 0; the entropy bonus gives the update a gradient.
    plain = _run(tmp_path / "plain", "plain", entropy_loss_coef=0.01)
    sp = _run(
        tmp_path / "sp",
        "sp",
        entropy_loss_coef=0.01,
        **{"actor_train.world_size": 2, "actor_train.strategy_args.strategy_config": "{ulysses_size: 2}"},
    )
    assert [m["step"] for m in sp] == [m["step"] for m in plain] == [0, 1]
    # Same rollouts (the engine starts from the same weights and seed), so the same update.
    assert sp[1]["rollout/samples"] == plain[1]["rollout/samples"] == 16
    assert plain[1]["actor/grad_norm"] > 1e-3
    for key in ("actor/loss", "actor/entropy_loss", "actor/entropy"):
        assert sp[1][key] == pytest.approx(plain[1][key], abs=1e-5), key
    assert sp[1]["actor/grad_norm"] == pytest.approx(plain[1]["actor/grad_norm"], rel=1e-5)
