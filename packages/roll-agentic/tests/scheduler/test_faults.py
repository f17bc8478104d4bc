"""Faulty envs inside a rollout: the batch still fills up, faults are counted, validation counts them as failed."""

from __future__ import annotations

import asyncio
import traceback

import pytest
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env.base import EnvOutputError
from roll.agentic.env_manager import EpisodeTask
from roll.agentic.policy import MockPolicyClient, ScriptedPolicy
from roll.agentic.pool import EnvSlot
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.scheduler.executors import RayExecutor
from roll.runtime import WorkerError
from roll.strategies import GenerationConfig


class SometimesBrokenEnv:
    """Solved in one step; seeds divisible by 3 raise, seeds with remainder 1 hang, others are fine."""

    def __init__(self, hang_s: float = 2.0) -> None:
        self.hang_s, self.seed = hang_s, 0

    def reset(self, seed=None):
        self.seed = seed
        return f"state {seed % 5}", {}

    def step(self, action):
        if self.seed % 3 == 0:
            raise RuntimeError("env crashed")
        if self.seed % 3 == 1:
            import time

            time.sleep(self.hang_s)
        return "done", 1.0, True, False, {"success": True}


ENVS = {
    "ok": CustomEnvConfig(env_type="frozen_lake", max_steps=2),
    "bad": CustomEnvConfig(env_type=f"{__name__}:SometimesBrokenEnv", max_steps=2, step_timeout_s=0.2),
}


def make(tokenizer, mode):
    # Base seed 3: the first round of the "bad" groups plays seeds that raise (seed % 3 == 0) and that hang
    # (seed % 3 == 1), whichever group ids the "bad" tag gets (see roll.agentic.scheduler.plan.episode_seed).
    config = EnvManagerConfig(num_env_groups=6, group_size=2, tags=["ok", "bad"], num_groups_partition=[3, 3])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>"))
    return RolloutScheduler.local(
        config, ENVS, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=2048, mode=mode, seed=3,
    )  # fmt: skip


def test_training_rollout_goes_on_around_faults(tokenizer) -> None:
    scheduler = make(tokenizer, "train")
    out = scheduler.get_batch(12)
    m = out.metrics
    assert len(out.batch) == 12 and m["rollout/groups_kept"] == 6
    assert m["rollout/groups_faulted"] >= 1 and m["rollout/env_faults"] >= 2
    assert m["rollout/env_faults"] == m.get("rollout/end_reason/env_error", 0) + m.get(
        "rollout/end_reason/env_timeout", 0
    )
    faulted = [e for e in out.episodes if e.faulted]
    assert all(e.batch is None and not e.success for e in faulted)
    # Kept rows never come from a faulted round.
    faulted_rounds = {e.task.traj_group_id for e in faulted}
    assert faulted_rounds.isdisjoint(set(out.batch.non_tensor_batch["traj_group_id"].tolist()))
    assert set(out.batch.non_tensor_batch["end_reason"].tolist()) <= {"terminated", "truncated", "max_steps"}
    scheduler.close()


def test_validation_counts_faulted_episodes_as_failures(tokenizer) -> None:
    scheduler = make(tokenizer, "val")
    out = scheduler.get_batch()
    m = out.metrics
    episodes = out.episodes
    assert len(episodes) == 12 and m["val/groups_kept"] == 6
    bad = [e for e in episodes if e.task.tag == "bad"]
    expected = sum(1 for e in bad if not e.faulted) / len(bad)
    assert m["val/bad/success"] == expected < 1.0
    assert m["val/success"] == sum(e.success for e in episodes) / 12
    assert len(out.batch) == sum(not e.faulted for e in episodes)
    scheduler.close()


class _Remote:
    def __init__(self, outcome) -> None:
        self.outcome = outcome

    async def remote(self, task):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _FakeWorker:
    def __init__(self, outcome) -> None:
        self.run_episode = _Remote(outcome)


class _FakeCluster:
    name = "train_env"

    def __init__(self, *outcomes) -> None:
        self.workers = [_FakeWorker(o) for o in outcomes]


def _task(env_id: int) -> EpisodeTask:
    return EpisodeTask(env_id, 0, "Lake", 0, 1, "g", f"t{env_id}")


def test_an_actor_that_died_inside_an_episode_is_not_the_env_workers_death() -> None:
    """Ray delivers an error raised inside run_episode (here: the policy server it called had died) as
    RayTaskError(ActorDiedError), which is a RayActorError too: the live EnvironmentWorker must not be declared dead
    and its slots moved (each worker in turn, until 'every worker died'); the run stops naming the real cause."""
    try:
        raise ActorDiedError()
    except ActorDiedError as cause:
        inside = RayTaskError("run_episode", traceback.format_exc(), cause).as_instanceof_cause()
    assert isinstance(inside, RayActorError)
    slots = {0: [EnvSlot(0, 0, "Lake")], 1: [EnvSlot(1, 0, "Lake")]}
    executor = RayExecutor(_FakeCluster(inside, "ok"), slots)
    with pytest.raises(WorkerError, match=r"run_episode\(t0\)"):
        asyncio.run(executor.run(_task(0)))
    assert executor.alive == {0, 1} and executor.worker_deaths == 0 and executor.episodes_rerun == 0
    # the worker's own death still moves its slots and reruns the episode on a live worker
    executor = RayExecutor(_FakeCluster(ActorDiedError(), "ok"), slots)
    assert asyncio.run(executor.run(_task(0))) == "ok"
    assert executor.alive == {1} and executor.worker_deaths == 1 and executor.episodes_rerun == 1


class FourTupleEnv:
    """A user's env whose step returns gym's old 4-tuple (no truncated flag)."""

    def reset(self, seed=None):
        return "start", {}

    def step(self, action):
        return "done", 1.0, True, {}


@pytest.mark.parametrize("mode", ["train", "val"])
def test_an_env_that_never_follows_the_contract_stops_the_rollout(tokenizer, mode) -> None:
    # Dropping malformed groups keeps a rollout going around a flaky env; when no episode is well-formed, training
    # would run every step on nothing and validation would report 0 success: one error names the env and the fault.
    envs = {"Four": CustomEnvConfig(env_type=f"{__name__}:FourTupleEnv", max_steps=2)}
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["Four"])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>"))
    scheduler = RolloutScheduler.local(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=2048, mode=mode,
    )  # fmt: skip
    try:
        with pytest.raises(EnvOutputError, match=r"every episode .* env_malformed, e.g. env tag 'Four': step\(\) must"):
            scheduler.get_batch(4)
    finally:
        scheduler.close()
