"""A tiny Atropos env for tests and dry runs (needs ``roll-agentic[atropos]``; no dataset, no hub, no server).

``atropos_env_path: roll.agentic.env.atropos.testing:TinyArithmeticEnv`` asks three arithmetic questions in turn
(``QUESTIONS``; each env instance starts at the first) through Atropos's managed server, single turn, as Atropos's
GSM8kEnv asks its own: a system message (``SYSTEM``), the question; 1.0 for a response holding the right
``\\boxed{}`` answer, else -1.0. The last response's text is kept in ``last_text``.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import ServerBaseline

__all__ = ["QUESTIONS", "SYSTEM", "TinyArithmeticEnv"]

SYSTEM = "Think in <think> </think>, then answer in \\boxed{}."
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 4 * 4?", "16"), ("What is 9 - 7?", "2")]


class TinyArithmeticEnv(BaseEnv):
    """Single turn, through Atropos's managed server (as GSM8kEnv asks): 1.0 for the right boxed answer, else -1.0."""

    name = "tiny_arithmetic"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline]:
        return BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=64), ServerBaseline()

    async def setup(self) -> None:
        self.iter = 0

    async def get_next_item(self) -> tuple[str, str]:
        item = QUESTIONS[self.iter % len(QUESTIONS)]
        self.iter += 1
        return item

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def collect_trajectories(self, item: tuple[str, str]) -> tuple[ScoredDataGroup | None, list[Any]]:
        question, answer = item
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=messages, n=self.config.group_size, max_tokens=64)
            node = managed.get_state()["nodes"][0]
        text = completion.choices[0].message.content
        self.last_text = text
        group = ScoredDataGroup(tokens=[node.tokens], masks=[node.masked_tokens], scores=[])
        group["scores"].append(1.0 if f"\\boxed{{{answer}}}" in text else -1.0)
        return group, []
