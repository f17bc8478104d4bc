"""Training steps that env faults leave without samples: a flaky env's run goes on; one broken for good stops after
rollout.max_faulted_steps such steps in a row, with one error naming the tags, the reasons and an example."""

from __future__ import annotations

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env_manager import EpisodeResult, EpisodeTask
from roll.agentic.policy import MockPolicyClient, ScriptedPolicy
from roll.agentic.scheduler import RolloutBatch, RolloutScheduler
from roll.agentic.scheduler.faulted_steps import FaultedSteps, RolloutFaultsError, describe_faults
from roll.strategies import GenerationConfig


class DownEnv:
    """An env whose service is down: every reset raises."""

    def reset(self, seed=None):
        raise ConnectionError("env service at 10.0.0.7:8000 is down")

    def step(self, action):
        raise AssertionError("never reached")


def _scheduler(tokenizer) -> RolloutScheduler:
    envs = {"Down": CustomEnvConfig(env_type=f"{__name__}:DownEnv", max_steps=2)}
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["Down"])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(lambda prompt: "<answer>Up</answer>"))
    return RolloutScheduler.local(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=8), sequence_length=512
    )


def test_an_env_that_always_faults_stops_after_the_limit(tokenizer) -> None:
    scheduler = _scheduler(tokenizer)
    steps = FaultedSteps(2, "train_env", output_dir="/runs/x")
    try:
        first = scheduler.get_batch(4, 1)
        # 2 groups needed, 4x as many launched (max_launch_factor), every one faulted: 8 groups of 2 episodes
        assert first.batch is None and first.metrics["rollout/groups_faulted"] == 8
        assert steps.record(1, first) == 1
        steps.check()  # one step: the run goes on
        assert steps.record(2, scheduler.get_batch(4, 2)) == 2
    finally:
        scheduler.close()
    with pytest.raises(RolloutFaultsError) as caught:
        steps.check()
    assert str(caught.value) == (
        "train_env: 2 steps in a row (steps 1-2) kept no sample because of env faults (env tags ['Down']: env_error "
        "x32; e.g. tag 'Down' env_error: reset() raised ConnectionError: env service at 10.0.0.7:8000 is down). Fix "
        "the env (or raise its custom_envs.<tag>.step_timeout_s if it is only slow); "
        "rollout.max_faulted_steps=2 is how many such steps stop a run (0 or null: never). Metrics and checkpoints "
        "written so far are kept in /runs/x"
    )


def _episode(tag: str, reason: str, error: str = "") -> EpisodeResult:
    task = EpisodeTask(0, 0, tag, 0, 1, "g", "t")
    return EpisodeResult(task, reason, 1, False, 0.0, None, None, error=error)


FAULTED = RolloutBatch(
    None, [_episode("A", "env_timeout", "step() did not return within 5 s"), _episode("B", "aborted")]
)
FILTERED = RolloutBatch(None, [_episode("A", "terminated")])  # a group filter dropped every group
TRAINED = RolloutBatch(object(), [_episode("A", "env_error", "boom"), _episode("A", "terminated")])  # type: ignore[arg-type]


def test_a_flaky_env_goes_on() -> None:
    steps = FaultedSteps(3, "train_env")
    streak = []
    for rollout in (FAULTED, FAULTED, TRAINED, FAULTED, FAULTED, FILTERED, FAULTED, FAULTED):
        streak.append(steps.record(len(streak) + 1, rollout))
        steps.check()
    assert streak == [1, 2, 0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("limit", [0, None])
def test_zero_or_null_never_stops(limit) -> None:
    steps = FaultedSteps(limit, "train_env")
    for step in range(1, 20):
        steps.record(step, FAULTED)
        steps.check()


def test_the_description_counts_reasons_and_shows_an_example() -> None:
    episodes = [_episode("B", "aborted"), _episode("A", "env_error", "boom"), _episode("A", "env_error", "boom")]
    assert describe_faults(episodes) == "env tags ['A', 'B']: env_error x2, aborted x1; e.g. tag 'A' env_error: boom"
    assert describe_faults([_episode("A", "terminated")]) == "no faulted episode"


def test_the_config_field() -> None:
    from roll.agentic.pipeline.config import AgenticRolloutSection

    assert AgenticRolloutSection().max_faulted_steps == 3
    assert AgenticRolloutSection(max_faulted_steps=None).max_faulted_steps is None
    with pytest.raises(ValueError, match="max_faulted_steps"):
        AgenticRolloutSection(max_faulted_steps=-1)
