"""The batching adapter over a real inference Cluster (mock_infer), used from EnvironmentWorkers and through a
shared PolicyServer actor."""

from __future__ import annotations

import asyncio
import os

import pytest
import ray
import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.policy import ClusterPolicyClient, GenerateRequest, RemotePolicyClient, serve_policy
from roll.agentic.scheduler import RolloutScheduler
from roll.runtime import Cluster
from roll.strategies import GenerationConfig, StrategyArgs, StrategyWorkerConfig


@pytest.fixture(scope="module")
def actor_infer(resources, tokenizer):
    config = StrategyWorkerConfig(
        name="agentic_actor_infer",
        world_size=1,
        strategy_args=StrategyArgs(
            strategy_name="mock_infer",
            strategy_config={"vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 3},
        ),
    )
    cluster = Cluster("agentic_actor_infer", "roll.pipelines.rlvr.workers.InferWorker", resources, config)
    cluster.initialize()
    yield cluster
    cluster.shutdown()


def test_env_workers_generate_with_the_cluster(actor_infer, tokenizer, resources) -> None:
    client = ClusterPolicyClient(actor_infer, pad_token_id=tokenizer.pad_token_id)
    envs = {"FL": CustomEnvConfig(env_type="frozen_lake", env_config={"format_penalty": -0.1}, max_steps=3)}
    config = EnvManagerConfig(name="cluster_env", num_env_groups=2, group_size=2, tags=["FL"])
    scheduler = RolloutScheduler.on_ray(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=12),
        sequence_length=4096, resource_manager=resources,
    )  # fmt: skip
    try:
        out = scheduler.get_batch(4)
    finally:
        scheduler.close()
    batch = out.batch
    assert len(batch) == 4 and out.metrics["rollout/episodes"] == 4
    # The mock engine's tokens are gibberish: every action is unparsable and pays the format penalty.
    assert out.metrics["rollout/format"] == 0.0 and all(e.episode_score == pytest.approx(-0.3) for e in out.episodes)
    mask = batch.batch["response_mask"].bool()
    log_probs = batch.batch["rollout_log_probs"]
    assert bool((log_probs[mask] < 0).all()) and bool((log_probs[~mask] == 0).all())
    assert set(batch.non_tensor_batch["finish_reason"].tolist()) <= {"stop", "length"}


def test_shared_policy_server(actor_infer, tokenizer, ray_session) -> None:
    server = serve_policy(ClusterPolicyClient(actor_infer, pad_token_id=0, batch_wait_s=0.05))
    remote = RemotePolicyClient(server)

    async def main():
        requests = [GenerateRequest(f"r{i}", [5 + i, 6, 7], GenerationConfig(max_new_tokens=6)) for i in range(6)]
        return await asyncio.gather(*(remote.generate(r) for r in requests))

    try:
        results = asyncio.run(main())
        assert [r.request_id for r in results] == [f"r{i}" for i in range(6)]
        assert all(0 < len(r.token_ids) <= 6 and r.policy_version == 0 for r in results)
        ray.get(server.set_policy_version.remote(2))
        assert asyncio.run(remote.generate(GenerateRequest("x", [9], GenerationConfig()))).policy_version == 2
        # the engine's blocking gets run on a worker thread: Ray's warning about the loop is off in this actor
        warns = ray.get(server.__ray_call__.remote(lambda actor: os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"]))
        assert warns == "0"
    finally:
        ray.kill(server)


@pytest.mark.slow
def test_real_model_with_hf_infer(resources, tmp_path_factory) -> None:
    """A tiny random Qwen2 served by hf_infer: log-probs are real (finite, < 0) and rows decode consistently."""
    from roll.agentic.worker import load_tokenizer
    from roll.strategies import ModelArgs
    from roll.strategies.testing import make_tiny_causal_lm

    path = make_tiny_causal_lm(tmp_path_factory.mktemp("agentic_tiny") / "nano", preset="nano", seed=0)
    tokenizer = load_tokenizer(str(path))
    config = StrategyWorkerConfig(
        name="agentic_hf_infer",
        world_size=1,
        model_args=ModelArgs(model_name_or_path=str(path), dtype="float32"),
        strategy_args=StrategyArgs(strategy_name="hf_infer"),
    )
    cluster = Cluster("agentic_hf_infer", "roll.pipelines.rlvr.workers.InferWorker", resources, config)
    try:
        cluster.initialize()
        client = ClusterPolicyClient(cluster, pad_token_id=tokenizer.pad_token_id)
        envs = {"FL": CustomEnvConfig(env_type="frozen_lake", max_steps=2, max_tokens_per_step=8)}
        config_env = EnvManagerConfig(name="hf_env", num_env_groups=1, group_size=2, tags=["FL"])
        scheduler = RolloutScheduler.local(
            config_env, envs, str(path), client, generation_config=GenerationConfig(max_new_tokens=8, temperature=1.0),
            sequence_length=2048,
        )  # fmt: skip
        out = scheduler.get_batch(2)
        scheduler.close()
    finally:
        cluster.shutdown()
    data = out.batch.batch
    mask = data["response_mask"].bool()
    assert mask.sum() > 0 and bool(torch.isfinite(data["rollout_log_probs"]).all())
    assert bool((data["rollout_log_probs"][mask] < 0).all()) and bool((data["rollout_log_probs"][~mask] == 0).all())
