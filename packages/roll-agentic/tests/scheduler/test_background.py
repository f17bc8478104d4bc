"""Asynchronous rollouts (BackgroundRollouts + GatedPolicyClient), in-process with a mock policy: bounded staleness,
every trajectory used once, generation overlapping "training", and the synchronous case at ratio 0."""

from __future__ import annotations

import time

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.policy import GatedPolicyClient, LatencyModel, MockPolicyClient, RandomActionPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.scheduler.background import BackgroundRollouts
from roll.strategies import GenerationConfig

ACTIONS = ["Up", "Down", "Left", "Right"]
ENVS = {"FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 4}, max_steps=3)}


def _rollouts(tokenizer, ratio: float) -> tuple[BackgroundRollouts, GatedPolicyClient]:
    config = EnvManagerConfig(num_env_groups=4, group_size=2, tags=["FL"])
    mock = MockPolicyClient(tokenizer, RandomActionPolicy(ACTIONS), LatencyModel(per_token_median_s=1e-4))
    gate = GatedPolicyClient(mock)
    scheduler = RolloutScheduler.local(
        config, ENVS, tokenizer, gate, generation_config=GenerationConfig(max_new_tokens=16), sequence_length=1024
    )
    return BackgroundRollouts(scheduler, batch_size=4, ratio=ratio), gate


def _wait_ready(background: BackgroundRollouts, groups: int) -> None:
    deadline = time.monotonic() + 120
    while background.accounting()["ready"] < groups:
        assert time.monotonic() < deadline, background.accounting()
        time.sleep(0.01)


def _sync(background: BackgroundRollouts, gate: GatedPolicyClient, step: int) -> None:
    """The pipeline's step boundary: pause generation, "copy weights", publish version ``step``, resume."""
    gate.pause_blocking(timeout_s=60)
    assert gate.in_flight == 0
    background.set_version(step)
    gate.resume(step)


@pytest.mark.parametrize("ratio", [1, 2])
def test_staleness_bounded_each_trajectory_used_once(tokenizer, ratio) -> None:
    background, gate = _rollouts(tokenizer, ratio)
    seen: set[str] = set()
    try:
        for step in range(1, 7):
            out = background.take(step, timeout_s=120)
            batch = out.batch
            assert batch is not None and len(batch) == 4
            versions = [int(v) for v in batch.non_tensor_batch["policy_version"]]
            # step k trains the policy of version k - 1; its trajectories are at most `ratio` versions older
            assert all(step - 1 - ratio <= v <= step - 1 for v in versions), (step, versions)
            assert out.metrics["async/batch_staleness_max"] == max(step - 1 - v for v in versions)
            assert out.metrics["async/staleness_max"] <= ratio
            traj_ids = set(batch.non_tensor_batch["traj_id"].tolist())
            assert len(traj_ids) == 4 and not traj_ids & seen  # never used twice
            seen |= traj_ids
            _wait_ready(background, 2)  # "training": generation goes on meanwhile, with the old weights
            _sync(background, gate, step)
            account = background.accounting()
            assert account["consumed"] == 2 * step
            assert (
                account["admitted"]
                == account["consumed"] + account["discarded"] + account["ready"] + account["generating"]
            )  # none lost
            assert account["admitted"] - account["discarded"] <= (step + 1 + ratio) * 2  # ran at most `ratio` ahead
    finally:
        background.close()
        background.scheduler.close()
    # generation overlapped training: from step 2 on, each batch was (at least partly) made before the last sync
    assert out.metrics["async/staleness_mean"] > 0


def test_ratio_0_trains_only_fresh_trajectories(tokenizer) -> None:
    background, gate = _rollouts(tokenizer, 0)
    try:
        for step in range(1, 4):
            batch = background.take(step, timeout_s=120).batch
            assert batch is not None
            assert {int(v) for v in batch.non_tensor_batch["policy_version"]} == {step - 1}
            _sync(background, gate, step)
    finally:
        background.close()
        background.scheduler.close()


def test_gate_waits_for_running_requests_and_stamps_the_new_version(tokenizer) -> None:
    import asyncio

    from roll.agentic.policy import GenerateRequest

    slow = MockPolicyClient(tokenizer, RandomActionPolicy(ACTIONS), LatencyModel(per_token_median_s=0.01))
    gate = GatedPolicyClient(slow)

    async def scenario() -> list[int]:
        request = GenerateRequest("r/0", [1, 2, 3], GenerationConfig(max_new_tokens=8))
        first = asyncio.ensure_future(gate.generate(request))
        await asyncio.sleep(0)  # started before the pause
        pausing = asyncio.ensure_future(gate.pause())
        await asyncio.sleep(0)
        second = asyncio.ensure_future(gate.generate(GenerateRequest("r/1", [1, 2], request.generation_config)))
        await pausing  # returns only once the first request is answered
        assert first.done() and not second.done()
        gate.resume(5)
        return [(await first).policy_version, (await second).policy_version]

    assert asyncio.run(scenario()) == [0, 5]
