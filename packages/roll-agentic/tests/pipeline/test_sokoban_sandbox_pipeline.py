"""The agentic_rollout pipeline on ``sokoban_sandbox``: a nano model plays Sokoban through roll's game server and
client in local stand-in sandboxes (ROLL's protocol, real processes); the rollouts hold the seeds' rooms, every
episode ends without a fault, and no server outlives the run."""

from __future__ import annotations

import pytest

from roll.agentic.env import SokobanEnv
from roll.agentic.env.sokoban_sandbox.local import LocalSandbox, live_processes

pytestmark = [pytest.mark.integration, pytest.mark.pipeline_run]

TEMPLATE = "Current State:\n{observation}\nTurn {turn_idx}:\n{suffix}\nFormat: <answer>ACTION</answer>"


def test_agentic_rollout_plays_sokoban_in_local_sandboxes(nano_rollout, monkeypatch) -> None:
    started: list[LocalSandbox] = []  # the envs run in the driver (rollout.env_workers: local)
    original = LocalSandbox.start

    def start(self: LocalSandbox) -> None:
        started.append(self)
        original(self)

    monkeypatch.setattr(LocalSandbox, "start", start)
    box = {
        "env_type": "sokoban_sandbox",
        "env_config": {"sandbox_cls": "roll.agentic.env.sokoban_sandbox.local:LocalSandbox"},
        "max_steps": 2,
        "max_tokens_per_step": 8,
        "agent_template": TEMPLATE,
    }
    _, episodes, rows = nano_rollout("SokobanSandbox", box, groups=2, group_size=2)
    assert len(episodes) == 4 and len(rows) == 4
    # the nano model's 8 random tokens are no answer: the episode runs to max_steps
    assert all(e["end_reason"] in ("truncated", "max_steps", "terminated") for e in episodes), episodes
    room = SokobanEnv().reset(episodes[0]["seed"])[0]  # the sandbox's room is the local env's for the seed
    assert any(f"Current map:\n{room}" in row["prompt"] for row in rows)
    assert all("Sokoban: you are the player P" in row["prompt"] for row in rows)
    # one sandbox per env slot (and the driver's first-prompt check), each stopped with its server
    assert len(started) >= 4 and all(box.root is None and live_processes(box.groups) == [] for box in started)
