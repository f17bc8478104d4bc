"""The agentic_rollout pipeline on atropos_env: a tiny model answers a GSM8K-shaped Atropos env (roll's tiny test env,
no dataset) through the agent_native manager; the Atropos env scores each response and roll shapes the reward."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.extra("atropos")]
pytest.importorskip("atroposlib")

MODEL = "tiny://nano?seed=0"


@pytest.mark.pipeline_run
def test_agentic_rollout_plays_an_atropos_env(nano_rollout) -> None:
    from roll.pipelines.assets import resolve_model_uri

    math = {
        "env_type": "atropos_env",
        "env_manager_cls": "agent_native",
        "max_steps": 1,
        "max_tokens_per_step": 8,
        "env_config": {
            "atropos_env_path": "roll.agentic.env.atropos.testing:TinyArithmeticEnv",
            "max_steps": 1,
            "env_config": {"tokenizer_name": resolve_model_uri(MODEL)},
        },
    }
    out, _, rows = nano_rollout("Math", math, groups=2, group_size=2, sequence_length=256)
    assert len(rows) == 4
    # each env slot's first item; the nano model's 8 random tokens hold no boxed answer: the Atropos env scores -1,
    # so the reward is ROLL's shaped one, -1 + len(response) / 1000 (no <think>, no \boxed{)
    assert all("What is 2 + 3?" in row["prompt"] for row in rows)
    assert all(-1.0 < row["score"] < -0.9 for row in rows), [row["score"] for row in rows]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert metrics[-1]["rollout/Math/atropos_scored"] == 1.0 and metrics[-1]["rollout/Math/success"] == 0.0
