"""EnvironmentWorker: a Ray actor hosting many env managers on one asyncio event loop.

Its role (``train_env``/``val_env``) is an :class:`~roll.agentic.config.EnvManagerConfig`. ``initialize`` receives
an :class:`EnvWorkerSetup` (the custom_envs, tokenizer, policy client and this worker's env slots) and builds the
envs; afterwards the rollout scheduler calls :meth:`EnvironmentWorker.run_episode` on individual workers, many at
once (the actor is async, so episodes interleave while they await the policy or their env calls).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, LLMProxyConfig
from roll.agentic.env_manager import EpisodeResult, EpisodeTask
from roll.agentic.policy.protocol import PolicyClient
from roll.agentic.pool import EnvPool, EnvSlot
from roll.protocol import Dispatch, register
from roll.runtime import ConfigError, Worker
from roll.strategies import GenerationConfig

__all__ = ["EnvWorkerSetup", "EnvironmentWorker", "load_tokenizer"]


@dataclass
class EnvWorkerSetup:
    """What every EnvironmentWorker of a role needs (shipped once, to all ranks)."""

    custom_envs: dict[str, CustomEnvConfig]
    tokenizer: Any
    """A tokenizer object, or the path of an HF tokenizer folder."""
    client: PolicyClient
    generation_config: GenerationConfig
    sequence_length: int
    slots: dict[int, list[EnvSlot]] = field(default_factory=dict)
    """Env slots per worker rank."""
    llm_proxy: LLMProxyConfig | None = None
    """The manager's ``llm_proxy`` (who acts: see :class:`~roll.agentic.pool.EnvPool`); None: the policy."""


def load_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer itself, or one loaded from a local folder (offline)."""
    if not isinstance(tokenizer, str | os.PathLike):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(tokenizer))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the tokenizer from {str(tokenizer)!r}: {e}") from e


class EnvironmentWorker(Worker):
    """Runs the episodes of its env slots; see the module docstring."""

    def __init__(self, worker_config: EnvManagerConfig) -> None:
        super().__init__(worker_config)
        self.pool: EnvPool | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    async def initialize(self, setup: EnvWorkerSetup) -> None:  # type: ignore[override]
        super().initialize(None)
        self.pool = EnvPool(
            setup.custom_envs,
            load_tokenizer(setup.tokenizer),
            setup.client,
            generation_config=setup.generation_config,
            sequence_length=setup.sequence_length,
            llm_proxy=setup.llm_proxy,
        )
        self.pool.add_slots(setup.slots.get(self.rank, []))

    def _pool(self) -> EnvPool:
        if self.pool is None:
            raise ConfigError(f"{self.worker_name}: call initialize() before running episodes")
        return self.pool

    async def run_episode(self, task: EpisodeTask) -> EpisodeResult:
        """Play one episode (building the slot's env first if the slot moved here from a lost worker)."""
        return await self._pool().run_episode(task)

    async def add_slots(self, slots: list[EnvSlot]) -> int:
        """Take over env slots (of a worker that died); returns how many slots this worker now hosts."""
        pool = self._pool()
        pool.add_slots(slots)
        return len(pool.managers)

    async def slot_ids(self) -> list[int]:
        return sorted(self._pool().managers)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    async def close_envs(self) -> None:
        if self.pool is not None:
            self.pool.close()
