"""A PolicyClient that answers every turn with its env's random action (``llm_proxy.proxy_type: random``).

A client cannot see the env, so the env pool gives each env slot of a random manager its own
:class:`RandomActionClient` over that slot's :class:`~roll.agentic.env_manager.EnvRunner`; the env managers play
their episodes as with any policy. The action text (e.g. FrozenLake's ``<answer>Left</answer>``) is tokenized with
the run's tokenizer and ends with EOS, as a model's finished turn does, so the sample layout is the policy's.
Log-probs are 0: the samples are a baseline's, not the policy's (a training manager refuses the proxy).

Each action is drawn with the request's seed (the turn's, derived from the episode's sampling seed), so a random
baseline replays exactly run to run, and the envs of a group (one env seed, each its own sampling seed) move
independently. The env's own RNG is not touched.
"""

from __future__ import annotations

from typing import Any, Protocol

from roll.agentic.policy.protocol import GenerateRequest, GenerateResult

__all__ = ["RandomActionClient"]


class RandomActions(Protocol):
    async def sample_random_action(self, seed: int | None = None) -> str: ...


class RandomActionClient:
    """Answers each request with ``env.sample_random_action(request.seed)``, tokenized (an env fault propagates as
    EnvFault)."""

    def __init__(self, env: RandomActions, tokenizer: Any) -> None:
        self.env, self.tokenizer = env, tokenizer
        self.eos_token_id = int(tokenizer.eos_token_id)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        text = await self.env.sample_random_action(request.seed)
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos_token_id]
        budget = request.generation_config.max_new_tokens
        if len(ids) > budget:
            return GenerateResult(request.request_id, ids[:budget], [0.0] * budget, "length")
        return GenerateResult(request.request_id, ids, [0.0] * len(ids), "stop")
