"""EnvironmentWorker actors: the same episodes as in-process, and a worker's death reschedules its episodes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
import ray

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env_manager import EpisodeTask
from roll.agentic.policy import (
    ClusterPolicyClient,
    GatedPolicyClient,
    LatencyModel,
    MockPolicyClient,
    RandomActionPolicy,
    RemotePolicyClient,
    serve_policy,
)
from roll.agentic.scheduler import RolloutScheduler
from roll.runtime import WorkerError
from roll.runtime.testing import ship_module_by_value
from roll.strategies import GenerationConfig

ENVS = {
    "FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 4}, max_steps=4),
    "SK": CustomEnvConfig(env_type="sokoban", env_config={"dim_room": [6, 6]}, max_steps=4),
}


def _build(tokenizer, where: str, resources=None, latency_s: float = 0.0) -> RolloutScheduler:
    config = EnvManagerConfig(
        name=f"env_{where}", num_env_groups=4, group_size=3, tags=["FL", "SK"], max_env_num_per_worker=6
    )
    client = MockPolicyClient(
        tokenizer,
        RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.1),
        LatencyModel(overhead_s=latency_s),
    )
    kwargs = dict(generation_config=GenerationConfig(max_new_tokens=32), sequence_length=2048, mode="train", seed=3)
    if where == "local":
        return RolloutScheduler.local(config, ENVS, tokenizer, client, **kwargs)
    return RolloutScheduler.on_ray(config, ENVS, tokenizer, client, resource_manager=resources, **kwargs)


def _rows(out) -> list[tuple[str, list[int]]]:
    batch = out.batch
    ids = [row[mask.bool()].tolist() for row, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"])]
    return sorted(zip(batch.non_tensor_batch["traj_id"].tolist(), ids))


@pytest.fixture(scope="module")
def local_rows(tokenizer):
    scheduler = _build(tokenizer, "local")
    try:
        return _rows(scheduler.get_batch(12))
    finally:
        scheduler.close()


def test_workers_play_the_same_episodes_as_in_process(tokenizer, resources, local_rows) -> None:
    scheduler = _build(tokenizer, "ray", resources)
    try:
        assert scheduler.executor.cluster.world_size == 2
        out = scheduler.get_batch(12)
        assert _rows(out) == local_rows
        assert out.metrics["rollout/workers_alive"] == 2 and out.metrics["rollout/worker_deaths"] == 0
        # A bug inside a worker (here: a tag it was never given) stops the rollout with an error naming the worker.
        scheduler.executor.owner[999] = 0
        bad = EpisodeTask(999, 0, "Nope", 0, 1, "Nope_0_0_1", "Nope_0_0_1_999")
        loop = asyncio.new_event_loop()
        with pytest.raises(WorkerError, match=r"env_ray rank 0 failed in run_episode\(Nope_0_0_1_999\)"):
            loop.run_until_complete(scheduler.executor.run(bad))
        loop.close()
    finally:
        scheduler.close()


def test_dead_worker_has_its_episodes_rescheduled(tokenizer, resources, local_rows) -> None:
    scheduler = _build(tokenizer, "ray_kill", resources, latency_s=0.25)
    victim = scheduler.executor.cluster.workers[1]

    async def kill_soon() -> None:
        await asyncio.sleep(0.4)  # every turn takes 0.25 s here: the victim's episodes are mid-flight
        ray.kill(victim, no_restart=True)

    async def both():
        out, _ = await asyncio.gather(scheduler.aget_batch(12), kill_soon())
        return out

    loop = asyncio.new_event_loop()
    try:
        out = loop.run_until_complete(both())
        m = out.metrics
        assert m["rollout/worker_deaths"] == 1 and m["rollout/workers_alive"] == 1
        assert m["rollout/episodes_rerun"] >= 1 and m["rollout/episodes"] == 12
        # Exactly the episodes of the undisturbed run: none lost, none duplicated, replays identical.
        assert _rows(out) == local_rows
        owners = scheduler.executor.owner
        assert 1 not in owners.values() and sorted(owners) == list(range(12))
        assert len(scheduler.get_batch(12).batch) == 12  # later batches run on the survivors
    finally:
        loop.close()
        scheduler.close()


class _EngineNeverAnswers:
    """An ``actor_infer`` hung in its generate call."""

    dp_size = 1

    def generate(self, batch, config):
        threading.Event().wait()


def test_a_cancelled_rollout_cancels_its_episodes_on_the_workers(tokenizer, resources) -> None:
    """Cancelling a rollout on the driver (an error elsewhere in the step, a shutdown) cancels its episodes on the
    EnvironmentWorkers, and their generation requests in the policy server. Before, they went on unobserved, their
    requests counted as running in the server's gate, which the next weight sync's pause waited for."""
    ship_module_by_value(__name__)
    server = serve_policy(GatedPolicyClient(ClusterPolicyClient(_EngineNeverAnswers(), pad_token_id=0)))
    config = EnvManagerConfig(name="env_cancel", num_env_groups=2, group_size=2, tags=["FL"], max_env_num_per_worker=4)
    scheduler = RolloutScheduler.on_ray(
        config, ENVS, tokenizer, RemotePolicyClient(server), resource_manager=resources,
        generation_config=GenerationConfig(max_new_tokens=8), sequence_length=2048, mode="train", seed=3,
    )  # fmt: skip

    async def in_flight_becomes(count: int) -> None:
        deadline = time.monotonic() + 60
        while await server.__ray_call__.remote(lambda actor: actor.client.in_flight) != count:
            assert time.monotonic() < deadline, f"the policy server never counted {count} running requests"
            await asyncio.sleep(0.02)

    loop = asyncio.new_event_loop()
    try:
        assert scheduler.executor.cluster.world_size == 1
        rollout = loop.create_task(scheduler.aget_batch(4))
        loop.run_until_complete(in_flight_becomes(4))  # every episode waits on the hung engine
        rollout.cancel()
        loop.run_until_complete(in_flight_becomes(0))
        assert rollout.cancelled()
    finally:
        loop.close()
        scheduler.close()
        ray.kill(server)


def test_redundant_episodes_on_the_workers_are_cancelled_and_their_slots_play_on(tokenizer, resources) -> None:
    """``group_size_redundancy`` on EnvironmentWorkers: each round keeps group_size episodes; the episodes still
    running are cancelled on their worker, and their env slots play the next rounds."""
    config = EnvManagerConfig(
        name="env_redundant", num_env_groups=2, group_size=2, group_size_redundancy=2, tags=["FL"],
        max_env_num_per_worker=4,
    )  # fmt: skip
    client = MockPolicyClient(
        tokenizer,
        RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.1),
        LatencyModel(overhead_s=0.01, per_token_median_s=1e-4, per_token_sigma=2.0),
    )
    scheduler = RolloutScheduler.on_ray(
        config, ENVS, tokenizer, client, resource_manager=resources,
        generation_config=GenerationConfig(max_new_tokens=32), sequence_length=2048, mode="train", seed=3,
    )  # fmt: skip
    try:
        assert scheduler.executor.cluster.world_size == 2  # 8 envs, 4 per worker
        for _ in range(3):
            out = scheduler.get_batch(4)
            m = out.metrics
            assert m["rollout/groups_kept"] == 2 and m.get("rollout/groups_faulted", 0) == 0
            assert m["rollout/episodes"] + m["rollout/episodes_cancelled"] == 8  # 2 rounds x 4 envs
            rows = out.batch.non_tensor_batch
            assert len(set(rows["traj_id"].tolist())) == 4  # two episodes of each of the two rounds
            assert sorted(Counter(rows["traj_group_id"].tolist()).values()) == [2, 2]
    finally:
        scheduler.close()
