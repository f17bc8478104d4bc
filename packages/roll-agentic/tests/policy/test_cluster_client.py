"""ClusterPolicyClient: per-turn requests served by batch generate calls, in-process and on a real Cluster."""

from __future__ import annotations

import asyncio

import torch

from roll.agentic.policy import ClusterPolicyClient, GenerateRequest, prompts_to_batch
from roll.protocol import DataProto
from roll.strategies import GenerationConfig
from roll.strategies.generation import build_generation_output, prompt_token_lists


class FakeCluster:
    """Answers each prompt with [len(prompt), sum(prompt) % 50, EOS=1]; records batch sizes and configs."""

    dp_size = 2

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def generate(self, batch: DataProto, config: GenerationConfig) -> DataProto:
        self.calls.append((len(batch), config.max_new_tokens))
        prompts = prompt_token_lists(batch)
        responses = [[len(p), sum(p) % 50 + 2, 1] for p in prompts]
        log_probs = [[-0.1, -0.2, -0.3] for _ in prompts]
        return build_generation_output(
            batch, responses, log_probs, ["stop"] * len(prompts), num_return_sequences=1,
            max_new_tokens=config.max_new_tokens, pad_token_id=0,
        )  # fmt: skip


def test_prompts_to_batch_left_pads() -> None:
    batch = prompts_to_batch([[5, 6, 7], [8]], pad_token_id=0)
    assert batch.batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_requests_are_batched_per_generation_config() -> None:
    cluster = FakeCluster()
    client = ClusterPolicyClient(cluster, pad_token_id=0, batch_wait_s=0.01, policy_version=3)
    prompts = [[i + 2] * (i + 1) for i in range(5)]

    async def main():
        requests = [
            GenerateRequest(f"r{i}", p, GenerationConfig(max_new_tokens=8 if i % 2 else 16))
            for i, p in enumerate(prompts)
        ]
        return await asyncio.gather(*(client.generate(r) for r in requests))

    results = asyncio.run(main())
    # One engine call per config (odd -> 8 tokens, even -> 16), each padded to the data-parallel size of 2.
    assert sorted(cluster.calls) == [(2, 8), (4, 16)]
    for result, prompt in zip(results, prompts):
        assert result.token_ids == [len(prompt), sum(prompt) % 50 + 2, 1]
        assert result.log_probs == [torch.tensor(v).item() for v in (-0.1, -0.2, -0.3)]
        assert result.finish_reason == "stop" and result.policy_version == 3
    client.set_policy_version(4)
    assert asyncio.run(client.generate(GenerateRequest("x", [9], GenerationConfig()))).policy_version == 4
