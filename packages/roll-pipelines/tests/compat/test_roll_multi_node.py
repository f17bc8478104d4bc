"""A ROLL file whose vLLM engines span two 8-GPU nodes (as ROLL's Qwen3.5-397B example) passes ``roll validate``."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.cli import main
from roll.pipelines.config import load_config

SOURCE = Path(__file__).parent / "fixtures" / "roll" / "rlvr_multi_node_vllm.yaml"


def test_vllm_engines_over_two_nodes_pass_validate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--no-ray", str(SOURCE)]) == 0
    out = capsys.readouterr().out
    assert "actor_infer: 2 of 2 worker(s) run one engine over 2 nodes" in out
    assert "actor_infer: 2 worker(s), vllm, devices" in out
    assert f"OK: {SOURCE} is a valid rlvr config" in out


def test_the_roles_vllm_settings_are_rolls_multi_node_ones() -> None:
    config = load_config(SOURCE)
    infer = config.actor_infer
    assert (config.num_nodes, config.num_gpus_per_node) == (6, 8)
    assert infer.num_gpus_per_worker == 16 and infer.world_size == 2
    settings = infer.strategy_args.strategy_config
    assert settings["tensor_parallel_size"] == 16
    assert settings["engine_kwargs"]["distributed_executor_backend"] == "ray"
