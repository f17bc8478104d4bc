"""The agentic_rollout pipeline on rock_tb_native_env: a nano model plays SWE tasks in scripted ROCK sandboxes
(roll.agentic.env.rock.testing), the tests' verdict is the reward, and every sandbox is stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.agentic.env.rock.testing import ScriptedRockSandbox, write_tasks

pytestmark = pytest.mark.integration
NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"


@pytest.mark.pipeline_run
def test_agentic_rollout_plays_rock_tasks(nano_rollout, tmp_path: Path):
    ScriptedRockSandbox.made.clear()
    ScriptedRockSandbox.scenario = {}
    swe = {
        "env_type": "rock_tb_native_env",
        "env_manager_cls": NATIVE,
        "max_steps": 3,
        "max_tokens_per_step": 8,
        "env_config": {**write_tasks(tmp_path / "tasks"), "mode": "val", "max_steps": 3},
    }
    _, episodes, rows = nano_rollout("SWE", swe, groups=2, group_size=1, mode="val")
    assert len(episodes) == 2 and {e["tag"] for e in episodes} == {"SWE"}
    # The nano model's 8 random tokens hold no tool call: the agent's session ends, the (passing) tests run.
    assert all(e["end_reason"] == "terminated" and e["success"] for e in episodes), episodes
    assert len(rows) == 2 and all(r["response"] and r["prompt"] for r in rows)
    boxes = ScriptedRockSandbox.made
    assert len(boxes) >= 2 and all(box.stopped == 1 for box in boxes)
    assert sorted(box.image for box in boxes[:2]) == ["swebench/sweb.eval:t1", "swebench/sweb.eval:t2"]
    assert all(box.runs[-1] == "cd /testbed && bash /tests/run-tests.sh" for box in boxes[:2])
