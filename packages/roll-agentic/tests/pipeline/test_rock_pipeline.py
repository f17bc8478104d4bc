"""The agentic_rollout pipeline on rock_tb_native_env: a nano model plays SWE tasks in scripted ROCK sandboxes
(roll.agentic.env.rock.testing), the tests' verdict is the reward, and every sandbox is stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.agentic.env.rock.testing import ScriptedRockSandbox, write_tasks
from roll.agentic.pipeline import register_pipelines
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config

pytestmark = pytest.mark.integration
MODEL = "tiny://nano?seed=0"
NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"


@pytest.mark.pipeline_run
def test_agentic_rollout_plays_rock_tasks(ray_env, tmp_path: Path):
    register_pipelines()
    ScriptedRockSandbox.made.clear()
    ScriptedRockSandbox.scenario = {}
    swe = {
        "env_type": "rock_tb_native_env",
        "env_manager_cls": NATIVE,
        "max_steps": 3,
        "max_tokens_per_step": 8,
        "env_config": {**write_tasks(tmp_path / "tasks"), "mode": "val", "max_steps": 3},
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
        "custom_envs": {"SWE": swe},
        "train_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["SWE"]},
        "actor_infer": {
            "name": "rock-infer",
            "model_args": {"model_name_or_path": MODEL, "dtype": "float32"},
            "strategy_args": {"strategy_name": "hf_infer"},
            "generating_args": {"max_new_tokens": 8},
        },
    }
    run_config(load_config(data))
    folder = tmp_path / "out" / "rollouts"
    episodes = [json.loads(line) for line in (folder / "step-000001-episodes.jsonl").open()]
    rows = [json.loads(line) for line in (folder / "step-000001.jsonl").open()]
    assert len(episodes) == 2 and {e["tag"] for e in episodes} == {"SWE"}
    # The nano model's 8 random tokens hold no tool call: the agent's session ends, the (passing) tests run.
    assert all(e["end_reason"] == "terminated" and e["success"] for e in episodes), episodes
    assert len(rows) == 2 and all(r["response"] and r["prompt"] for r in rows)
    boxes = ScriptedRockSandbox.made
    assert len(boxes) >= 2 and all(box.stopped == 1 for box in boxes)
    assert sorted(box.image for box in boxes[:2]) == ["swebench/sweb.eval:t1", "swebench/sweb.eval:t2"]
    assert all(box.runs[-1] == "cd /testbed && bash /tests/run-tests.sh" for box in boxes[:2])
