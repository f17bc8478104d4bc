"""The agentic_rollout pipeline on ``sokoban_mcp``: a tiny model plays Sokoban rooms served by roll's Sokoban MCP
server (started for the module); the rollouts hold the server's rooms and every episode ends without a fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.agentic.env import SokobanEnv
from roll.agentic.pipeline import register_pipelines
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config

pytestmark = [pytest.mark.integration, pytest.mark.extra("mcp"), pytest.mark.pipeline_run]
MODEL = "tiny://nano?seed=0"


def test_agentic_rollout_plays_sokoban_on_an_mcp_server(ray_env: None, sokoban_mcp_server: str, tmp_path: Path) -> None:
    register_pipelines()
    box = {
        "env_type": "sokoban_mcp",
        "env_config": {"server_url": f"{sokoban_mcp_server}/sse", "max_steps": 2},
        "max_steps": 2,
        "max_tokens_per_step": 8,
    }
    data = {
        "pipeline_cls": "agentic_rollout",
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 1024,
        "rollout": {"env_workers": "local"},
        "custom_envs": {"Box": box},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Box"]},
        "actor_infer": {
            "name": "sokoban-mcp-infer",
            "model_args": {"model_name_or_path": MODEL, "dtype": "float32"},
            "strategy_args": {"strategy_name": "hf_infer"},
            "generating_args": {"max_new_tokens": 8},
        },
    }
    run_config(load_config(data))
    folder = tmp_path / "out" / "rollouts"
    episodes = [json.loads(line) for line in (folder / "step-000001-episodes.jsonl").open()]
    rows = [json.loads(line) for line in (folder / "step-000001.jsonl").open()]
    assert len(episodes) == 4 and len(rows) == 4
    # the nano model's 8 random tokens are no answer: two format penalties, the episode truncated by max_steps
    assert all(e["end_reason"] in ("truncated", "max_steps", "terminated") for e in episodes), episodes
    room = SokobanEnv().reset(episodes[0]["seed"])[0]  # the server's room is the local env's for the seed
    assert any(room in row["prompt"] for row in rows)
    assert all("You are solving the Sokoban puzzle" in row["prompt"] for row in rows)
