"""The mock policy client: deterministic per request, latency-modelled, concurrent."""

from __future__ import annotations

import asyncio
import random

from roll.agentic.policy import GenerateRequest, LatencyModel, MockPolicyClient, PolicyClient, RandomActionPolicy
from roll.strategies import GenerationConfig


def _request(i: int, max_new_tokens: int = 32) -> GenerateRequest:
    return GenerateRequest(f"traj{i}/0", [5, 6, 7], GenerationConfig(max_new_tokens=max_new_tokens))


def test_results_depend_on_the_request_not_the_order(tokenizer) -> None:
    policy = RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.3)
    a, b = MockPolicyClient(tokenizer, policy, seed=1), MockPolicyClient(tokenizer, policy, seed=1)
    assert isinstance(a, PolicyClient)

    async def run(client, order):
        return {i: await client.generate(_request(i)) for i in order}

    forward = asyncio.run(run(a, range(20)))
    backward = asyncio.run(run(b, reversed(range(20))))
    assert {i: r.token_ids for i, r in forward.items()} == {i: r.token_ids for i, r in backward.items()}
    texts = {tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in forward.values()}
    assert len(texts) > 2 and all(r.token_ids[-1] == tokenizer.eos_token_id for r in forward.values())
    assert all(r.finish_reason == "stop" and len(r.log_probs) == len(r.token_ids) for r in forward.values())


def test_truncation_reports_length(tokenizer) -> None:
    client = MockPolicyClient(tokenizer, lambda prompt, rng: "a long answer " * 20)
    result = asyncio.run(client.generate(_request(0, max_new_tokens=4)))
    assert result.finish_reason == "length" and len(result.token_ids) == 4
    assert tokenizer.eos_token_id not in result.token_ids


def test_latency_model_and_overlap(tokenizer) -> None:
    latency = LatencyModel(per_token_median_s=0.002, per_token_sigma=0.5, overhead_s=0.01)
    rng = random.Random(0)
    draws = [latency.sample(rng, 10, 20) for _ in range(200)]
    assert min(draws) > 0.01 and max(draws) > 2 * min(draws)  # lognormal spread between requests
    client = MockPolicyClient(tokenizer, lambda p, r: "<answer>Up</answer>", LatencyModel(overhead_s=0.2))

    async def many():
        return await asyncio.gather(*(client.generate(_request(i)) for i in range(10)))

    asyncio.run(many())
    # All ten 0.2 s requests were in flight at once: served concurrently, not one after another.
    assert client.stats.peak_in_flight == 10 and client.stats.requests == 10
    capped = MockPolicyClient(tokenizer, lambda p, r: "x", LatencyModel(overhead_s=0.01), max_concurrency=3)

    async def capped_run():
        return await asyncio.gather(*(capped.generate(_request(i)) for i in range(10)))

    asyncio.run(capped_run())
    assert capped.stats.peak_in_flight == 3
