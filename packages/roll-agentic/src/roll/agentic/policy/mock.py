"""A policy client for tests and benchmarks: scripted or random responses with a modelled engine latency.

Every request draws from its own generator, seeded by ``(seed, request_id)``, so results do not depend on the
order in which concurrent requests arrive. The latency model is lognormal per-token decode time (one draw per
request, as requests of one batch decode at different speeds) plus prefill and a fixed overhead; an optional
``max_concurrency`` models an engine's capacity.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.policy.protocol import GenerateRequest, GenerateResult
from roll.runtime import ConfigError

__all__ = [
    "LatencyModel",
    "MockPolicyClient",
    "MockStats",
    "RandomActionPolicy",
    "ScriptedPolicy",
    "TextPolicy",
]

TextPolicy = Callable[[str, random.Random], str]
"""``policy(prompt_text, rng) -> response_text``."""


@dataclass(frozen=True)
class LatencyModel:
    """Seconds a request takes: ``overhead_s + prefill_s_per_token * prompt + per_token_s * generated``, with
    ``per_token_s`` lognormal (median ``per_token_median_s``, log-space std ``per_token_sigma``)."""

    per_token_median_s: float = 0.0
    per_token_sigma: float = 0.0
    prefill_s_per_token: float = 0.0
    overhead_s: float = 0.0

    def sample(self, rng: random.Random, prompt_tokens: int, new_tokens: int) -> float:
        per_token = self.per_token_median_s * math.exp(self.per_token_sigma * rng.gauss(0.0, 1.0))
        return self.overhead_s + self.prefill_s_per_token * prompt_tokens + per_token * new_tokens


class ScriptedPolicy:
    """Responses from a function of the prompt text, or from a list (cycled through per request)."""

    def __init__(self, responses: Sequence[str] | Callable[[str], str]) -> None:
        self.responses = responses
        self._next = 0

    def __call__(self, prompt: str, rng: random.Random) -> str:
        if callable(self.responses):
            return self.responses(prompt)
        response = self.responses[self._next % len(self.responses)]
        self._next += 1
        return response


class RandomActionPolicy:
    """A uniformly random action in ``template``; with probability ``invalid_prob`` an unparsable answer."""

    def __init__(
        self,
        actions: Sequence[str],
        template: str = "<answer>{}</answer>",
        invalid_prob: float = 0.0,
        invalid_text: str = "I am not sure what to do.",
    ) -> None:
        if not actions:
            raise ConfigError("RandomActionPolicy needs at least one action")
        self.actions, self.template = list(actions), template
        self.invalid_prob, self.invalid_text = invalid_prob, invalid_text

    def __call__(self, prompt: str, rng: random.Random) -> str:
        if rng.random() < self.invalid_prob:
            return self.invalid_text
        return self.template.format(rng.choice(self.actions))


@dataclass
class MockStats:
    """What the mock served: requests, generated tokens, and the peak number of requests in flight."""

    requests: int = 0
    generated_tokens: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    prompt_lengths: list[int] = field(default_factory=list)


class MockPolicyClient:
    """A :class:`~roll.agentic.policy.protocol.PolicyClient` answering with ``policy``'s text, tokenized."""

    def __init__(
        self,
        tokenizer: Any,
        policy: TextPolicy,
        latency: LatencyModel | None = None,
        *,
        seed: int = 0,
        policy_version: int = 0,
        max_concurrency: int | None = None,
        log_prob: float = -0.5,
    ) -> None:
        self.tokenizer, self.policy = tokenizer, policy
        self.latency = latency or LatencyModel()
        self.seed, self.policy_version, self.log_prob = seed, policy_version, log_prob
        self.max_concurrency = max_concurrency
        self._semaphore: asyncio.Semaphore | None = None
        self.stats = MockStats()
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ConfigError("MockPolicyClient needs a tokenizer with an eos_token_id")
        self.eos_token_id = int(eos)

    def _tokens(self, request: GenerateRequest, rng: random.Random) -> tuple[list[int], str]:
        prompt = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
        text = self.policy(prompt, rng)
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos_token_id]
        limit = request.generation_config.max_new_tokens
        if len(ids) > limit:
            return ids[:limit], "length"
        return ids, "stop"

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.max_concurrency is not None and self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        rng = random.Random(f"{self.seed}:{request.request_id}")
        ids, finish = self._tokens(request, rng)
        delay = self.latency.sample(rng, len(request.prompt_ids), len(ids))
        stats = self.stats
        if self._semaphore is not None:
            await self._semaphore.acquire()
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            stats.in_flight -= 1
            if self._semaphore is not None:
                self._semaphore.release()
        stats.requests += 1
        stats.generated_tokens += len(ids)
        stats.prompt_lengths.append(len(request.prompt_ids))
        return GenerateResult(request.request_id, ids, [self.log_prob] * len(ids), finish, self.policy_version)  # type: ignore[arg-type]
