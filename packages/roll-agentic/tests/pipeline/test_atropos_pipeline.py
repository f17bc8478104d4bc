"""The agentic_rollout pipeline on atropos_env: a tiny model answers a GSM8K-shaped Atropos env (written here, no
dataset) through the agent_native manager; the Atropos env scores each response and roll shapes the reward."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.extra("atropos")]
pytest.importorskip("atroposlib")

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup  # noqa: E402
from atroposlib.envs.server_handling.server_baseline import ServerBaseline  # noqa: E402

MODEL = "tiny://nano?seed=0"
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 4 * 4?", "16")]


class TinyMathEnv(BaseEnv):
    name = "tiny_math"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline]:
        return BaseEnvConfig(group_size=8, use_wandb=False, max_token_length=16), ServerBaseline()

    async def setup(self) -> None:
        self.iter = 0

    async def get_next_item(self) -> tuple[str, str]:
        item = QUESTIONS[self.iter % len(QUESTIONS)]
        self.iter += 1
        return item

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def collect_trajectories(self, item: tuple[str, str]) -> tuple[ScoredDataGroup, list[Any]]:
        question, answer = item
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=[{"role": "user", "content": question}], n=1)
            node = managed.get_state()["nodes"][0]
        score = 1.0 if f"\\boxed{{{answer}}}" in completion.choices[0].message.content else -1.0
        return ScoredDataGroup(tokens=[node.tokens], masks=[node.masked_tokens], scores=[score]), []


@pytest.mark.pipeline_run
def test_agentic_rollout_plays_an_atropos_env(nano_rollout) -> None:
    from roll.pipelines.assets import resolve_model_uri

    math = {
        "env_type": "atropos_env",
        "env_manager_cls": "agent_native",
        "max_steps": 1,
        "max_tokens_per_step": 8,
        "env_config": {
            "atropos_env_path": f"{__name__}:TinyMathEnv",
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
