"""``llm_proxy.proxy_type: random``: the env's own random actions play the episodes through the rollout scheduler."""

from __future__ import annotations

import asyncio
import random

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, LLMProxyConfig
from roll.agentic.env.frozen_lake import FrozenLakeEnv
from roll.agentic.env_manager import EpisodeTask
from roll.agentic.policy import GenerateRequest, MockPolicyClient, RandomActionClient
from roll.agentic.policy.expert import FrozenLakeExpert
from roll.agentic.pool import EnvPool, env_checks
from roll.agentic.scheduler import RolloutScheduler
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig

LAKE = {"Lake": CustomEnvConfig(env_type="frozen_lake", max_steps=8, env_config={"size": 4, "max_steps": 8})}
ACTIONS = {f"<answer>{a}</answer>" for a in FrozenLakeEnv.ACTIONS}


class Unused:
    """The policy client of a random manager: never asked."""

    async def generate(self, request):
        raise AssertionError(f"the policy was asked for {request.request_id}")


def rollout(tokenizer, client, proxy: str, groups: int = 16, seed: int = 5, envs: dict | None = None) -> dict:
    envs = envs or LAKE
    config = EnvManagerConfig(num_env_groups=groups, group_size=4, tags=list(envs), llm_proxy={"proxy_type": proxy})
    scheduler = RolloutScheduler.local(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=4096, mode="val", seed=seed,
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


def played(out) -> list[tuple[str, str, float]]:
    """Each sample row's episode, its decoded responses and its score."""
    batch = out.batch
    return [
        (
            str(batch.non_tensor_batch["traj_id"][i]),
            str(batch.batch["responses"][i][batch.batch["response_mask"][i].bool()].tolist()),
            float(batch.non_tensor_batch["episode_scores"][i]),
        )
        for i in range(len(batch))
    ]


def test_a_random_baseline_replays_run_to_run(tokenizer) -> None:
    first, second = (played(rollout(tokenizer, Unused(), "random", groups=4)) for _ in range(2))
    assert first == second and len(first) == 16
    # the envs of a group share a board but each moves with its own turns' seeds; another run seed, other moves
    by_group: dict[str, set[str]] = {}
    for traj_id, actions, _ in first:
        by_group.setdefault(traj_id.rsplit("_", 1)[0], set()).add(actions)
    assert all(len(actions) > 1 for actions in by_group.values())
    other = played(rollout(tokenizer, Unused(), "random", groups=4, seed=6))
    assert [actions for _, actions, _ in other] != [actions for _, actions, _ in first]


class SeedRecorder:
    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    async def sample_random_action(self, seed=None):
        self.seeds.append(seed)
        return "<answer>Up</answer>"


def test_the_random_client_draws_with_each_requests_seed(tokenizer) -> None:
    env = SeedRecorder()
    client = RandomActionClient(env, tokenizer)
    for seed in (11, None, 12):
        request = GenerateRequest(f"t/{seed}", [1, 2], GenerationConfig(max_new_tokens=32), seed=seed)
        result = asyncio.run(client.generate(request))
    assert env.seeds == [11, None, 12] and result.finish_reason == "stop"
    assert tokenizer.decode(result.token_ids, skip_special_tokens=True) == "<answer>Up</answer>"


TOOL_MATH = {
    "Calc": CustomEnvConfig(
        env_type="tool_math", max_steps=2, env_config={"digits": 2, "operators": "*", "max_steps": 2}
    )
}


def test_random_proxy_plays_a_tool_env_with_the_wrapped_envs_answers(tokenizer) -> None:
    out = rollout(tokenizer, Unused(), "random", groups=2, envs=TOOL_MATH)
    batch = out.batch
    assert len(batch) == 8 and set(batch.non_tensor_batch["end_reason"]) <= {"terminated", "max_steps"}
    for i in range(len(batch)):
        text = tokenizer.decode(batch.batch["responses"][i][batch.batch["response_mask"][i].bool()].tolist())
        assert "<answer>" in text and "<tool_call>" not in text
    assert [e.metrics.get("tool_use_counter") for e in out.episodes] == [0.0] * 8
    assert played(out) == played(rollout(tokenizer, Unused(), "random", groups=2, envs=TOOL_MATH))


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


def test_random_proxy_refuses_a_tool_wrapped_env_without_random_actions(tokenizer) -> None:
    wrapper = {"tool_configs": [{"tool_id": "python_code"}]}
    envs = {"Plain": CustomEnvConfig(env_type=f"{__name__}:NoRandomEnv", tool_wrapper=wrapper)}
    config = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Plain"], llm_proxy={"proxy_type": "random"})
    with pytest.raises(ConfigError, match=r"custom_envs.Plain: env_type .* \(inside its tool wrapper\) has no samp"):
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
    with pytest.raises(ConfigError, match=r"unknown keys \['base_ur'\].*; did you mean 'base_ur' -> 'base_url'\?"):
        EnvManagerConfig(
            tags=["Lake"], llm_proxy={"proxy_type": "openai", "proxy_config": {"base_ur": "x", "model_name": "m"}}
        )
    with pytest.raises(ConfigError, match=r"proxy_config \['base_url'\] is set but proxy_type random"):
        EnvManagerConfig(tags=["Lake"], llm_proxy={"proxy_type": "random", "proxy_config": {"base_url": "x"}})
    assert EnvManagerConfig(tags=["Lake"]).llm_proxy.proxy_type == "policy"


def make_plain_env() -> NoRandomEnv:
    """A factory function: only a built env tells whether it has random actions."""
    return NoRandomEnv()


NO_RANDOM = (
    "custom_envs.Plain: env_type '{}' has no sample_random_action(), which llm_proxy.proxy_type random plays; use "
    "proxy_type policy for this tag"
)


def _random_tags(envs: dict, proxy: str = "random") -> list[str | None]:
    manager = EnvManagerConfig(num_env_groups=1, group_size=1, tags=list(envs), llm_proxy={"proxy_type": proxy})
    return [check() for check in env_checks(envs, [manager])]


def test_load_time_checks_refuse_a_random_proxy_tag_whose_env_has_no_random_actions() -> None:
    """The same refusal as EnvPool's, before any worker starts: from the env class where it tells (a tool wrapper
    passes its wrapped env's), else from one env built in the driver (a factory function)."""
    for env_type in (f"{__name__}:NoRandomEnv", f"{__name__}:make_plain_env"):
        with pytest.raises(ConfigError) as caught:
            _random_tags({"Plain": CustomEnvConfig(env_type=env_type)})
        assert str(caught.value) == NO_RANDOM.format(env_type)
    wrapper = {"tool_configs": [{"tool_id": "python_code"}]}
    with pytest.raises(ConfigError, match=r"^custom_envs.Plain: env_type .* \(inside its tool wrapper\) has no samp"):
        _random_tags({"Plain": CustomEnvConfig(env_type=f"{__name__}:NoRandomEnv", tool_wrapper=wrapper)})
    plain = {"Plain": CustomEnvConfig(env_type=f"{__name__}:NoRandomEnv")}
    assert len(_random_tags(plain, proxy="policy")) == 1  # the entry's own check only: the policy plays it


def test_load_time_checks_pass_random_proxy_tags_whose_envs_have_random_actions() -> None:
    envs = {**LAKE, "Math": CustomEnvConfig(env_type="tool_math"), **TOOL_MATH}  # a class; a factory's tool wrapper
    lines = _random_tags(envs)
    assert [line for line in lines if line and "sample_random_action" in line] == [
        f"{tag}: env_type {envs[tag].env_type!r} has sample_random_action() for llm_proxy random" for tag in envs
    ]


def test_roll_validate_and_the_pipeline_setup_refuse_it_before_any_worker_starts(tmp_path) -> None:
    """A val manager playing a tag with llm_proxy random: roll validate fails with EnvPool's message, and so does the
    pipeline's setup, before its session or any cluster starts."""
    from roll.agentic.pipeline import AgenticConfig, AgenticPipeline
    from roll.pipelines.validate import validate_deployment

    role = {"model_args": {"model_name_or_path": str(tmp_path / "no-model")}}
    config = AgenticConfig.model_validate(
        {
            "actor_train": role,
            "actor_infer": {**role, "generating_args": {"max_new_tokens": 16}},
            "custom_envs": {
                "Lake": {"env_type": "frozen_lake", "env_config": {"size": 3}},
                "Plain": {"env_type": f"{__name__}:NoRandomEnv"},
            },
            "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["Lake"]},
            "val_env_manager": {
                "num_env_groups": 1, "group_size": 1, "tags": ["Plain"], "llm_proxy": {"proxy_type": "random"}
            },
            "rollout_batch_size": 1,
            "advantage": {"estimator": "reinforce"},
            "output_dir": str(tmp_path / "out"),
        }
    )  # fmt: skip
    message = NO_RANDOM.format(f"{__name__}:NoRandomEnv")
    with pytest.raises(ConfigError) as caught:
        validate_deployment(config, check_ray=False)
    assert str(caught.value) == message
    pipeline = AgenticPipeline(config)
    with pytest.raises(ConfigError) as caught:
        pipeline.setup()
    assert str(caught.value) == message
    assert not pipeline.clusters and pipeline._session is None


def test_agentic_rollout_setup_refuses_it_before_any_worker_starts(tmp_path) -> None:
    from roll.agentic.pipeline.rollout_only import AgenticRolloutConfig, AgenticRolloutPipeline

    manager = {"num_env_groups": 1, "group_size": 1, "tags": ["Plain"], "llm_proxy": {"proxy_type": "random"}}
    config = AgenticRolloutConfig.model_validate(
        {
            "actor_infer": {"model_args": {"model_name_or_path": str(tmp_path / "no-model")}},
            "custom_envs": {"Plain": {"env_type": f"{__name__}:NoRandomEnv"}},
            "train_env_manager": manager,
            "rollout_batch_size": 1,
            "output_dir": str(tmp_path / "out"),
        }
    )
    assert any("check_random_actions" in repr(check) for check in config.deployment_checks())
    pipeline = AgenticRolloutPipeline(config)
    with pytest.raises(ConfigError) as caught:
        pipeline.setup()
    assert str(caught.value) == NO_RANDOM.format(f"{__name__}:NoRandomEnv")
    assert not pipeline.clusters and pipeline._session is None


def test_a_proxy_key_its_api_does_not_read_is_refused() -> None:
    # chat-only keys on the default api (completions) would never reach the server
    base = {"base_url": "http://x/v1", "model_name": "m"}
    message = (
        r"\['enable_thinking', 'native_tools'\] only apply to api: "
        r"chat, and this proxy's api is completions \(the default\): remove them, or set proxy_config.api: chat"
    )
    with pytest.raises(ConfigError, match=message):
        proxy_config = {**base, "enable_thinking": False, "native_tools": False}
        EnvManagerConfig(tags=["Lake"], llm_proxy={"proxy_type": "openai", "proxy_config": proxy_config})
    # token_ids is read by both apis (chat: vLLM's sampled ids of a chat answer)
    chat = {**base, "api": "chat", "enable_thinking": True, "native_tools": False, "token_ids": True}
    completions = {**base, "api": "completions", "token_ids": False}
    for accepted in (chat, completions):
        manager = EnvManagerConfig(tags=["Lake"], llm_proxy={"proxy_type": "openai", "proxy_config": accepted})
        assert manager.llm_proxy.proxy_config == accepted


def test_a_chat_proxys_enable_thinking_must_match_its_tags(tmp_path) -> None:
    """Under api: chat the server renders the turn and roll the sample's prompt: one enable_thinking for both, in the
    agentic pipeline's val manager and in agentic_rollout's manager; unset on the proxy, the tags' settings stand."""
    from roll.agentic.pipeline import AgenticConfig
    from roll.agentic.pipeline.rollout_only import AgenticRolloutConfig

    def proxy(**extra: object) -> dict:
        config = {"base_url": "http://x/v1", "model_name": "m", "api": "chat", **extra}
        return {"proxy_type": "openai", "proxy_config": config}

    envs = {"Lake": {"env_type": "frozen_lake"}, "Think": {"env_type": "frozen_lake", "enable_thinking": True}}
    role = {"model_args": {"model_name_or_path": str(tmp_path / "no-model")}}
    rollout = {"actor_infer": role, "custom_envs": envs, "rollout_batch_size": 2, "output_dir": str(tmp_path)}
    manager = {"num_env_groups": 2, "group_size": 1, "tags": ["Lake", "Think"]}
    message = (
        "train_env_manager.llm_proxy.proxy_config.enable_thinking is True, but custom_envs Lake: False "
        "(enable_thinking): the server would render each turn one way and the samples' prompts the other. Set "
        "custom_envs.<tag>.enable_thinking: true for those tags, or remove proxy_config.enable_thinking to leave the "
        "server's template default"
    )
    with pytest.raises(ConfigError) as caught:
        AgenticRolloutConfig.model_validate(
            {**rollout, "train_env_manager": {**manager, "llm_proxy": proxy(enable_thinking=True)}}
        )
    assert message in str(caught.value)
    for accepted in (proxy(), proxy(enable_thinking=None)):
        config = AgenticRolloutConfig.model_validate(
            {**rollout, "train_env_manager": {**manager, "llm_proxy": accepted}}
        )
        assert [config.custom_envs[tag].enable_thinking for tag in manager["tags"]] == [False, True]
    AgenticRolloutConfig.model_validate(
        {
            **rollout,
            "train_env_manager": {
                **manager,
                "tags": ["Think"],
                "num_env_groups": 1,
                "llm_proxy": proxy(enable_thinking=True),
            },
        }
    )

    pipeline = {
        "actor_train": role,
        "actor_infer": role,
        "custom_envs": envs,
        "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["Lake"]},
        "rollout_batch_size": 1,
        "advantage": {"estimator": "reinforce"},
        "output_dir": str(tmp_path),
    }
    val = {"num_env_groups": 1, "group_size": 1, "tags": ["Think"], "llm_proxy": proxy(enable_thinking=False)}
    with pytest.raises(
        ConfigError,
        match=r"<root>: val_env_manager.llm_proxy.proxy_config.enable_thinking is False, but custom_envs Think: True ",
    ):
        AgenticConfig.model_validate({**pipeline, "val_env_manager": val})
