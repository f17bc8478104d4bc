"""``llm_proxy.proxy_type: random``: the env's own random actions play the episodes through the rollout scheduler."""

from __future__ import annotations

import asyncio
import random

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, LLMProxyConfig
from roll.agentic.env.frozen_lake import FrozenLakeEnv
from roll.agentic.env_manager import EpisodeTask
from roll.agentic.policy import MockPolicyClient
from roll.agentic.policy.expert import FrozenLakeExpert
from roll.agentic.pool import EnvPool
from roll.agentic.scheduler import RolloutScheduler
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig

LAKE = {"Lake": CustomEnvConfig(env_type="frozen_lake", max_steps=8, env_config={"size": 4, "max_steps": 8})}
ACTIONS = {f"<answer>{a}</answer>" for a in FrozenLakeEnv.ACTIONS}


class Unused:
    """The policy client of a random manager: never asked."""

    async def generate(self, request):
        raise AssertionError(f"the policy was asked for {request.request_id}")


def rollout(tokenizer, client, proxy: str, groups: int = 16) -> dict:
    config = EnvManagerConfig(num_env_groups=groups, group_size=4, tags=["Lake"], llm_proxy={"proxy_type": proxy})
    scheduler = RolloutScheduler.local(
        config, LAKE, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=4096, mode="val", seed=5,
    )  # fmt: skip
    try:
        return scheduler.get_batch(groups * 4)
    finally:
        scheduler.close()


def reference_success_rate(episodes: int = 2000) -> float:
    """A random mover on the same boards' distribution, played on the env directly."""
    rng, wins = random.Random(0), 0
    for seed in range(episodes):
        env = FrozenLakeEnv(size=4, max_steps=8)
        env.reset(seed)
        for _ in range(8):
            _, _, terminated, truncated, info = env.step(f"<answer>{rng.choice(FrozenLakeEnv.ACTIONS)}</answer>")
            if terminated or truncated:
                break
        wins += bool(info["success"])
    return wins / episodes


def test_random_proxy_plays_frozen_lake_with_a_random_movers_success_rate(tokenizer) -> None:
    out = rollout(tokenizer, Unused(), "random")
    batch = out.batch
    success = [bool(s) for s in batch.non_tensor_batch["success"]]
    assert len(success) == 64 and set(batch.non_tensor_batch["end_reason"]) <= {"terminated", "truncated", "max_steps"}
    # each turn's response is one of the env's actions, tokenized and ended with EOS as a model's finished turn
    mask = batch.batch["response_mask"][0].bool()
    generated = batch.batch["responses"][0][mask].tolist()
    turns = int(batch.non_tensor_batch["num_turns"][0])
    assert generated.count(tokenizer.eos_token_id) == turns
    text = tokenizer.decode(generated, skip_special_tokens=True)
    assert text.count("</answer>") == turns and set(text.replace("</answer>", "</answer>\n").split()) <= ACTIONS
    rate = sum(success) / len(success)
    expected = reference_success_rate()
    assert 0 < expected < 0.6 and abs(rate - expected) < 0.2, (rate, expected)
    # the planner on the same episodes wins them all: the random read is a baseline below it
    planned = rollout(tokenizer, MockPolicyClient(tokenizer, FrozenLakeExpert()), "policy")
    assert all(planned.batch.non_tensor_batch["success"]) and rate < 1


class NoRandomEnv:
    """A user's env with no sample_random_action()."""

    def reset(self, seed=None):
        return "start", {}

    def step(self, action):
        return "done", 1.0, True, False, {}


def test_random_proxy_refuses_an_env_without_random_actions_by_tag(tokenizer) -> None:
    envs = {"Plain": CustomEnvConfig(env_type=f"{__name__}:NoRandomEnv")}
    config = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Plain"], llm_proxy={"proxy_type": "random"})
    with pytest.raises(ConfigError, match=r"custom_envs.Plain: env_type .* has no sample_random_action\(\)"):
        RolloutScheduler.local(config, envs, tokenizer, Unused(), sequence_length=512)


class BrokenRandomEnv(NoRandomEnv):
    def sample_random_action(self):
        raise RuntimeError("no moves today")


def test_a_failing_random_action_ends_the_episode_as_an_env_error(tokenizer) -> None:
    envs = {"Broken": CustomEnvConfig(env_type=f"{__name__}:BrokenRandomEnv")}
    pool = EnvPool(
        envs,
        tokenizer,
        Unused(),
        generation_config=GenerationConfig(),
        sequence_length=512,
        llm_proxy=LLMProxyConfig(proxy_type="random"),
    )
    task = EpisodeTask(env_id=0, group_id=0, tag="Broken", episode_id=0, seed=1, traj_group_id="g", traj_id="t")
    try:
        result = asyncio.run(pool.run_episode(task))
    finally:
        pool.close()
    assert (result.end_reason, result.batch) == ("env_error", None)
    assert "sample_random_action() raised RuntimeError: no moves today" in result.error


def test_proxy_config_is_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"proxy_type openai: proxy_config has unknown keys \['model'\]; lacks \['model_name'\]"
    ):
        EnvManagerConfig(
            tags=["Lake"], llm_proxy={"proxy_type": "openai", "proxy_config": {"base_url": "x", "model": "m"}}
        )
    with pytest.raises(ConfigError, match=r"proxy_config \['base_url'\] is set but proxy_type random"):
        EnvManagerConfig(tags=["Lake"], llm_proxy={"proxy_type": "random", "proxy_config": {"base_url": "x"}})
    assert EnvManagerConfig(tags=["Lake"]).llm_proxy.proxy_type == "policy"
