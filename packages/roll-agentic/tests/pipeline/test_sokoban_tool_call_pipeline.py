"""The agentic_rollout pipeline on ROLL's ``sokoban_tool_call`` (agent-native manager, nano model): a move_player call
is asked for, every turn is a step-wise row, and replies without a ``move_player`` call cost the penalty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.agentic.pipeline import register_pipelines
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config

pytestmark = [pytest.mark.integration, pytest.mark.pipeline_run]
MODEL = "tiny://nano?seed=0"
NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"


def test_agentic_rollout_plays_sokoban_tool_call(ray_env, tmp_path: Path):
    register_pipelines()
    sokoban = {
        "env_type": "sokoban_tool_call",
        "env_manager_cls": NATIVE,
        "max_steps": 3,
        "max_tokens_per_step": 8,
        "env_config": {"max_steps": 3, "format_penalty": -0.15, "search_depth": 10, "full_history": True},
    }
    data = {
        "pipeline_cls": "agentic_rollout",
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        "plots": False,
        "mode": "val",
        "rollout_batch_size": 2,
        "sequence_length": 1024,
        "rollout": {"env_workers": "local"},
        "custom_envs": {"SokobanTool": sokoban},
        "train_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["SokobanTool"]},
        "actor_infer": {
            "name": "sokoban-tool-infer",
            "model_args": {"model_name_or_path": MODEL, "dtype": "float32"},
            "strategy_args": {"strategy_name": "hf_infer"},
            "generating_args": {"max_new_tokens": 8},
        },
    }
    run_config(load_config(data))
    folder = tmp_path / "out" / "rollouts"
    episodes = [json.loads(line) for line in (folder / "step-000001-episodes.jsonl").open()]
    rows = [json.loads(line) for line in (folder / "step-000001.jsonl").open()]
    assert len(episodes) == 2 and {e["tag"] for e in episodes} == {"SokobanTool"}
    # 8 random tokens hold no move_player call: three turns of the invalid-action cost, then max_steps
    assert all(e["end_reason"] == "truncated" and not e["success"] for e in episodes), episodes
    assert len(rows) == 6
    assert all(r["score"] == pytest.approx(-0.1 - 0.15) for r in rows), [r["score"] for r in rows]
    # the system message asks for move_player calls (nano's template does not render tools; test_native checks that)
    assert all("calling the move_player tool" in r["prompt"] for r in rows)
    later = [r["prompt"] for r in rows if "No move_player call found in your reply" in r["prompt"]]
    assert len(later) == 4  # turns 2 and 3 of each episode show the reminder
