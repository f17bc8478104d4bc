"""The agentic_rollout pipeline on ROLL's ``sokoban_tool_call`` (agent-native manager, nano model): a move_player call
is asked for, every turn is a step-wise row, and replies without a ``move_player`` call cost the penalty."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.pipeline_run]
NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"


def test_agentic_rollout_plays_sokoban_tool_call(nano_rollout):
    sokoban = {
        "env_type": "sokoban_tool_call",
        "env_manager_cls": NATIVE,
        "max_steps": 2,
        "max_tokens_per_step": 8,
        # two turns: with the tools block (~290 of nano's tokens) and the full history a third turn's prompt is over
        # nano's 1024 positions
        "env_config": {"max_steps": 2, "format_penalty": -0.15, "search_depth": 10, "full_history": True},
    }
    _, episodes, rows = nano_rollout("SokobanTool", sokoban, groups=2, group_size=1, mode="val")
    assert len(episodes) == 2 and {e["tag"] for e in episodes} == {"SokobanTool"}
    # 8 random tokens hold no move_player call: two turns of the invalid-action cost, then max_steps
    assert all(e["end_reason"] == "truncated" and not e["success"] for e in episodes), episodes
    assert len(rows) == 4
    assert all(r["score"] == pytest.approx(-0.1 - 0.15) for r in rows), [r["score"] for r in rows]
    # the system message asks for move_player calls, and the template's tools block offers the tool
    assert all("calling the move_player tool" in r["prompt"] for r in rows)
    assert all('# Tools\n{"type": "function", "function": {"name": "move_player"' in r["prompt"] for r in rows)
    later = [r["prompt"] for r in rows if "No move_player call found in your reply" in r["prompt"]]
    assert len(later) == 2  # turn 2 of each episode shows the reminder
