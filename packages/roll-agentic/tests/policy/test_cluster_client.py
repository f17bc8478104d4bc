"""ClusterPolicyClient: per-turn requests served by batch generate calls, in-process and on a real Cluster."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.policy import ClusterPolicyClient, GenerateRequest, prompts_to_batch
from roll.agentic.scheduler import RolloutScheduler
from roll.protocol import DataProto
from roll.strategies import GenerationConfig
from roll.strategies.generation import SAMPLING_SEED_KEY, build_generation_output, prompt_token_lists


class FakeCluster:
    """Answers each prompt with [len(prompt), sum(prompt) % 50, EOS=1]; records batch sizes and configs."""

    dp_size = 2

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.seeds: list[list[int] | None] = []

    def generate(self, batch: DataProto, config: GenerationConfig) -> DataProto:
        self.calls.append((len(batch), config.max_new_tokens))
        seeded = SAMPLING_SEED_KEY in batch.batch.keys()
        self.seeds.append(batch.batch[SAMPLING_SEED_KEY].tolist() if seeded else None)
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


class _FirstCallWaits(FakeCluster):
    """A FakeCluster (one rank) whose first generate call waits for ``release`` (a slow engine call)."""

    dp_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def generate(self, batch: DataProto, config: GenerationConfig) -> DataProto:
        if not self.started.is_set():
            self.started.set()
            assert self.release.wait(60)
        return super().generate(batch, config)


def test_a_request_cancelled_while_queued_is_not_generated() -> None:
    """A caller cancelled while its request waits for the engine (its episode stopped) gets no generation: before,
    the queued request went into the next batch anyway, engine time spent for nobody (and, behind a gate, a weight
    sync's pause waiting for it)."""
    cluster = _FirstCallWaits()
    client = ClusterPolicyClient(cluster, pad_token_id=0, batch_wait_s=0)

    def request(name: str, prompt: list[int]) -> GenerateRequest:
        return GenerateRequest(name, prompt, GenerationConfig(max_new_tokens=4))

    async def main():
        first = asyncio.ensure_future(client.generate(request("first", [2, 3])))
        while not cluster.started.is_set():  # the engine is busy with the first request
            await asyncio.sleep(0.005)
        cancelled = asyncio.ensure_future(client.generate(request("cancelled", [4])))
        kept = asyncio.ensure_future(client.generate(request("kept", [5, 6, 7])))
        await asyncio.sleep(0.05)  # both queued behind the busy engine
        cancelled.cancel()
        cluster.release.set()
        return await first, await kept, cancelled.cancelled()

    first, kept, was_cancelled = asyncio.run(main())
    assert was_cancelled
    assert cluster.calls == [(1, 4), (1, 4)]  # the second engine call carried only the kept request
    assert first.token_ids == [2, 7, 1] and kept.token_ids == [3, 20, 1]


def test_seeded_requests_carry_their_seeds_and_go_apart_from_unseeded_ones() -> None:
    cluster = FakeCluster()
    client = ClusterPolicyClient(cluster, pad_token_id=0, batch_wait_s=0.01)
    config = GenerationConfig(max_new_tokens=8)

    async def main():
        requests = [GenerateRequest(f"r{i}", [i + 2], config, seed=None if i == 1 else 100 + i) for i in range(4)]
        return await asyncio.gather(*(client.generate(r) for r in requests))

    results = asyncio.run(main())
    assert [r.request_id for r in results] == ["r0", "r1", "r2", "r3"]
    # The seeded requests in one batch, their seeds in row order (padded to dp=2 with a copy of the first row);
    # the unseeded one in a batch of its own, without the column.
    assert sorted(cluster.seeds, key=str) == [None, [100, 102, 103, 100]]


class InProcessCluster:
    """An ``actor_infer`` stand-in: one hf_infer strategy in this process (data-parallel size 1)."""

    dp_size = 1

    def __init__(self, strategy) -> None:
        self.strategy = strategy

    def generate(self, batch: DataProto, config: GenerationConfig) -> DataProto:
        return self.strategy.generate(batch, config)


@pytest.fixture(scope="module")
def hf_cluster(tmp_path_factory):
    from roll.strategies import ModelArgs, StrategyArgs, StrategyWorker, StrategyWorkerConfig
    from roll.strategies.testing import make_tiny_causal_lm

    path = make_tiny_causal_lm(tmp_path_factory.mktemp("agentic_tiny") / "nano", preset="nano", seed=0)
    worker = StrategyWorker(
        StrategyWorkerConfig(
            name="hf",
            model_args=ModelArgs(model_name_or_path=str(path), dtype="float32"),
            strategy_args=StrategyArgs(strategy_name="hf_infer"),
        )
    )
    worker.initialize()
    return path, InProcessCluster(worker.strategy)


def play_hf(hf_cluster, *, seed: int, generation_seed: int | None = None, **client_options):
    """Two FrozenLake groups of two envs, three turns each, on hf_infer; ``{traj_id: (responses, log-probs)}``."""
    path, cluster = hf_cluster
    client = ClusterPolicyClient(cluster, pad_token_id=cluster.strategy.tokenizer.pad_token_id, **client_options)
    scheduler = RolloutScheduler.local(
        EnvManagerConfig(name="train_env", num_env_groups=2, group_size=2, tags=["FL"]),
        {"FL": CustomEnvConfig(env_type="frozen_lake", max_steps=3, max_tokens_per_step=8)},
        str(path),
        client,
        generation_config=GenerationConfig(max_new_tokens=8, temperature=1.0, seed=generation_seed),
        sequence_length=1024,
        seed=seed,
    )
    try:
        data = scheduler.get_batch(4).batch
    finally:
        scheduler.close()
    episodes = {
        traj: (data.batch["responses"][row].tolist(), data.batch["rollout_log_probs"][row])
        for row, traj in enumerate(data.non_tensor_batch["traj_id"])
    }
    return episodes, client.batches_sent


def test_hf_rollouts_repeat_exactly_whatever_the_batching(hf_cluster) -> None:
    one_by_one, calls_alone = play_hf(hf_cluster, seed=3, max_batch_size=1, batch_wait_s=0.0)
    pooled, calls_pooled = play_hf(hf_cluster, seed=3, max_batch_size=64, batch_wait_s=0.02)
    assert calls_pooled < calls_alone  # the turns really were batched differently
    assert pooled.keys() == one_by_one.keys() and len(pooled) == 4
    for traj, (tokens, log_probs) in one_by_one.items():
        assert pooled[traj][0] == tokens
        torch.testing.assert_close(pooled[traj][1], log_probs, atol=1e-5, rtol=0)
    # The two envs of a group share an env seed but sample on their own.
    by_group: dict[str, list[list[int]]] = {}
    for traj, (tokens, _) in one_by_one.items():
        by_group.setdefault(traj.rsplit("_", 1)[0], []).append(tokens)
    assert all(first != second for first, second in by_group.values())
    # Another generating_args.seed: the same episodes (traj ids, env seeds), other samples.
    reseeded, _ = play_hf(hf_cluster, seed=3, generation_seed=1)
    assert reseeded.keys() == one_by_one.keys()
    assert all(reseeded[traj][0] != tokens for traj, (tokens, _) in one_by_one.items())
