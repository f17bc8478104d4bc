"""EnvironmentWorker actors: the same episodes as in-process, and a worker's death reschedules its episodes."""

from __future__ import annotations

import asyncio

import pytest
import ray

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env_manager import EpisodeTask
from roll.agentic.policy import LatencyModel, MockPolicyClient, RandomActionPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.runtime import WorkerError
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
