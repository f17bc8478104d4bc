"""Helpers to play single episodes with an EnvPool and a scripted mock policy."""

from __future__ import annotations

import asyncio

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env_manager import EpisodeResult, EpisodeTask
from roll.agentic.policy import GenerateRequest, GenerateResult, MockPolicyClient, ScriptedPolicy
from roll.agentic.pool import EnvPool
from roll.strategies import GenerationConfig


class RecordingClient:
    """Wraps a client and keeps every request it served; ``wants_messages`` plays a chat proxy's flag."""

    def __init__(self, inner, wants_messages: bool = False) -> None:
        self.inner, self.wants_messages = inner, wants_messages
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        return await self.inner.generate(request)


@pytest.fixture
def scripted(tokenizer):
    """``scripted(responses, wants_messages=False) -> RecordingClient``: responses from a list (in order) or a
    function of the prompt."""

    def make(responses, wants_messages: bool = False) -> RecordingClient:
        return RecordingClient(MockPolicyClient(tokenizer, ScriptedPolicy(responses)), wants_messages)

    return make


@pytest.fixture
def play(tokenizer):
    """``play(spec, client, seed=0, sequence_length=4096, episodes=1, sampling_seed=None) -> list[EpisodeResult]``
    on one env slot (episode i plays env seed ``seed + i``, and sampling seed ``sampling_seed + i`` when given)."""

    def run(
        spec: CustomEnvConfig,
        client,
        seed: int = 0,
        sequence_length: int = 4096,
        episodes: int = 1,
        sampling_seed: int | None = None,
        **gen,
    ) -> list[EpisodeResult]:
        pool = EnvPool(
            {"T": spec},
            tokenizer,
            client,
            generation_config=GenerationConfig(max_new_tokens=gen.pop("max_new_tokens", 64), **gen),
            sequence_length=sequence_length,
        )

        async def main() -> list[EpisodeResult]:
            out = []
            for i in range(episodes):
                sampling = None if sampling_seed is None else sampling_seed + i
                task = EpisodeTask(0, 0, "T", i, seed + i, f"T_0_{i}_{seed}", f"T_0_{i}_{seed}_0", sampling)
                out.append(await pool.run_episode(task))
            return out

        try:
            return asyncio.run(main())
        finally:
            pool.close()

    return run


@pytest.fixture
def kept_messages(monkeypatch):
    """``kept_messages(manager_cls) -> sizes``: ``len(state.messages)`` after every turn of ``manager_cls``'s
    episodes, appended as they are played."""

    def spy_on(manager_cls) -> list[int]:
        sizes: list[int] = []
        observe = manager_cls.observe

        def spy(self, state, turn) -> None:
            sizes.append(len(state.messages))
            observe(self, state, turn)

        monkeypatch.setattr(manager_cls, "observe", spy)
        return sizes

    return spy_on
