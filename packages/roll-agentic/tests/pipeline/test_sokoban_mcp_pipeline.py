"""The agentic_rollout pipeline on ``sokoban_mcp``: a tiny model plays Sokoban rooms served by roll's Sokoban MCP
server (started for the module); the rollouts hold the server's rooms and every episode ends without a fault."""

from __future__ import annotations

import pytest

from roll.agentic.env import SokobanEnv

pytestmark = [pytest.mark.integration, pytest.mark.extra("mcp"), pytest.mark.pipeline_run]


def test_agentic_rollout_plays_sokoban_on_an_mcp_server(nano_rollout, sokoban_mcp_server: str) -> None:
    box = {
        "env_type": "sokoban_mcp",
        "env_config": {"server_url": f"{sokoban_mcp_server}/sse", "max_steps": 2},
        "max_steps": 2,
        "max_tokens_per_step": 8,
    }
    _, episodes, rows = nano_rollout("Box", box, groups=2, group_size=2)
    assert len(episodes) == 4 and len(rows) == 4
    # the nano model's 8 random tokens are no answer: two format penalties, the episode truncated by max_steps
    assert all(e["end_reason"] in ("truncated", "max_steps", "terminated") for e in episodes), episodes
    room = SokobanEnv().reset(episodes[0]["seed"])[0]  # the server's room is the local env's for the seed
    assert any(room in row["prompt"] for row in rows)
    assert all("You are solving the Sokoban puzzle" in row["prompt"] for row in rows)
