"""The agentic pipeline's config: ROLL's flat keys, estimator/layout rules, recipes, and registration."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.pipeline import PIPELINE_ENTRY_POINTS, AgenticConfig, register_pipelines
from roll.agentic.policy import MockPolicyClient
from roll.agentic.policy.expert import FrozenLakeExpert
from roll.agentic.scheduler import RolloutScheduler
from roll.pipelines.config import load_config
from roll.runtime import ConfigError, import_target
from roll.strategies import GenerationConfig

ROLE = {"model_name_or_path": "/models/tiny"}
ENVS = {
    "Lake": {"env_type": "frozen_lake", "env_manager_cls": "traj"},
    "LakeStep": {"env_type": "frozen_lake", "env_manager_cls": "step"},
}


def _config(tag: str = "Lake", **extra) -> AgenticConfig:
    data = {
        "actor_train": {"model_args": ROLE},
        "actor_infer": {"model_args": ROLE},
        "custom_envs": ENVS,
        "train_env_manager": {"num_env_groups": 2, "group_size": 4, "tags": [tag]},
        "rollout_batch_size": 8,
        **extra,
    }
    return AgenticConfig.model_validate(data)


def test_flat_keys_land_in_their_sections():
    config = _config(
        "LakeStep",
        adv_estimator="gigpo",
        episode_reward_weight=0.5,
        step_reward_weight=2.0,
        step_reward_gamma=0.9,
        ratio_type="segment",
        batch_adjust_mode="copy",
        sequence_length=2048,
        val_batch_size=16,
    )
    assert config.layout == "step"
    assert config.advantage.estimator == "gigpo"
    assert (config.advantage.episode_reward_weight, config.advantage.step_reward_weight) == (0.5, 2.0)
    assert config.advantage.step_reward_gamma == 0.9
    assert config.policy_loss.ratio_type == "segment"
    assert config.actor_settings().ratio_type == "segment"
    assert config.update.batch_adjust_mode == "copy"
    assert (config.rollout.sequence_length, config.rollout.val_batch_size) == (2048, 16)


def test_log_probs_are_taken_at_the_training_managers_sampling_temperature():
    # ROLL's agentic files set generating_args on the env managers; the training turns are sampled at the training
    # manager's temperature, so the loss, the old policy and the reference must read log-probs at that one too.
    config = _config(
        actor_infer={"model_args": ROLE, "generating_args": {"temperature": 1.0}},
        train_env_manager={
            "num_env_groups": 2,
            "group_size": 4,
            "tags": ["Lake"],
            "generating_args": {"temperature": 0.7},
        },
        val_env_manager={"num_env_groups": 2, "group_size": 1, "tags": ["Lake"], "generating_args": {"temperature": 0}},
    )
    assert config.sampling_temperature == 0.7
    assert config.actor_settings().temperature == 0.7
    assert config.policy_settings().temperature == 0.7
    assert (
        _config(actor_infer={"model_args": ROLE, "generating_args": {"temperature": 0.5}}).sampling_temperature == 0.5
    )
    # greedy training turns have no temperature to divide by: log-probs of the plain softmax
    greedy = _config(
        train_env_manager={
            "num_env_groups": 2,
            "group_size": 4,
            "tags": ["Lake"],
            "generating_args": {"temperature": 0},
        }
    )
    assert greedy.sampling_temperature == 1.0


def test_grpo_normalizes_within_episode_groups_by_default():
    norm = _config().reward_normalization
    assert (norm.grouping, norm.method, norm.norm_mean_type, norm.norm_std_type) == (
        "traj_group_id",
        "mean_std",
        "group",
        "group",
    )
    explicit = _config(reward_normalization={"grouping": "tags", "method": "mean"}).reward_normalization
    assert (explicit.grouping, explicit.norm_std_type) == ("tag", None)


def test_a_partial_reward_normalization_keeps_grpos_episode_groups():
    """A section (or an override such as ``reward_normalization.method=mean``) giving only part of it: grpo's and
    gigpo's defaults fill the rest. Before, it fell back to the field defaults: one mean over the whole batch, not
    within the episodes sharing a seed (no longer GRPO's group baseline), silently."""

    def norm(**section):
        n = _config(reward_normalization=section).reward_normalization
        return n.grouping, n.method, n.norm_mean_type, n.norm_std_type

    assert norm(method="mean") == ("traj_group_id", "mean", "group", None)
    assert norm(grouping="tags") == ("tag", "mean_std", "group", "group")
    assert norm(norm_mean_type="batch") == ("traj_group_id", "identity", "batch", None)
    gigpo = _config("LakeStep", adv_estimator="gigpo", reward_normalization={"method": "mean"}).reward_normalization
    assert (gigpo.grouping, gigpo.method) == ("traj_group_id", "mean")
    critic = {"model_args": ROLE, "strategy_args": {"strategy_name": "hf_infer"}}
    gae = _config(adv_estimator="gae", critic=critic, reward_normalization={"method": "mean"}).reward_normalization
    assert (gae.grouping, gae.method) == ("batch", "mean")  # not GRPO: the field defaults


def test_a_grouping_the_samples_lack_is_refused_when_the_config_loads():
    # A misspelt grouping passed validation and failed the first step's advantages ("agentic samples lack the
    # column 'traj_groupid'"), after the workers had started and a rollout was played.
    with pytest.raises(ValueError, match=r"grouping='traj_groupid' is not a column of the traj-wise samples.*tag "):
        _config(reward_normalization={"grouping": "traj_groupid", "method": "mean_std"})
    with pytest.raises(ValueError, match="grouping='state_hash' is not a column of the traj-wise samples"):
        _config(reward_normalization={"grouping": "state_hash", "method": "mean"})
    step = _config("LakeStep", reward_normalization={"grouping": "state_hash", "method": "mean"})
    assert step.reward_normalization.grouping == "state_hash"
    for grouping in ("batch", "tags", "env_ids", "group_ids", "traj_group_id", "traj_id"):
        _config(reward_normalization={"grouping": grouping, "method": "mean"})
    # gae does not normalize: a grouping it never reads is not checked
    critic = {"model_args": ROLE, "strategy_args": {"strategy_name": "hf_infer"}}
    _config(adv_estimator="gae", critic=critic, reward_normalization={"grouping": "nothing", "method": "mean"})


@pytest.mark.parametrize(
    ("tag", "estimator", "fragment"),
    [
        ("Lake", "gigpo", "does not fit traj-wise"),
        ("LakeStep", "agentic_reinforce", "does not fit step-wise"),
        ("Lake", "gae", "needs a critic"),
    ],
)
def test_estimator_must_fit_the_layout(tag, estimator, fragment):
    with pytest.raises(ValueError, match=fragment):
        _config(tag, adv_estimator=estimator)


def test_batch_must_hold_whole_groups_and_tags_must_exist():
    with pytest.raises(
        ValueError,
        match=r"rollout.batch_size \(rollout_batch_size\)=6 must be a positive multiple of "
        "train_env_manager.group_size=4",
    ):
        _config(rollout_batch_size=6)
    # validation's batch too, and the rounds max_traj_per_env allows: said when the config loads, not at step 0
    val = {"val_env_manager": {"num_env_groups": 2, "group_size": 4, "tags": ["Lake"], "max_traj_per_env": 1}}
    with pytest.raises(
        ValueError,
        match=r"rollout.val_batch_size \(val_batch_size\)=10 must be a positive multiple "
        "of val_env_manager.group_size=4",
    ):
        _config(val_batch_size=10, **val)
    with pytest.raises(
        ValueError,
        match=r"val_batch_size\)=16 needs 4 groups but val_env_manager has 2 groups x "
        "max_traj_per_env=1",
    ):
        _config(val_batch_size=16, **val)
    assert _config(val_batch_size=8, **val).rollout.val_batch_size == 8
    with pytest.raises(ValueError, match="not in custom_envs"):
        _config("Nope")


def test_schedule_counts_warmup_and_rl_steps():
    config = _config(max_steps=10, ppo_epochs=2, warmup={"steps": 5})
    assert config.actor_train.training_args.max_steps == 25
    again = AgenticConfig.model_validate(config.model_dump())  # a dumped config loads back to itself
    assert again.actor_train.training_args.max_steps == 25
    # each warm-up step takes num_mini_batches optimizer steps
    assert _config(max_steps=10, warmup={"steps": 5, "num_mini_batches": 3}).actor_train.training_args.max_steps == 25


def test_schedule_counts_every_mini_batch_of_an_rl_step():
    """ppo_mini_batch_size 3 over 8 trajectory-wise rows: 3 optimizer steps per epoch, so a cosine schedule spans
    10 x 2 x 3 = 60 RL steps plus the warm-up's (it used to span one per epoch, and the rate reached 0 a third of the
    way through)."""
    cosine = {"actor_train": {"model_args": ROLE, "training_args": {"lr_scheduler_type": "cosine"}}}
    config = _config(max_steps=10, ppo_epochs=2, ppo_mini_batch_size=3, warmup={"steps": 5}, **cosine)
    assert config.actor_train.training_args.max_steps == 60 + 5
    assert AgenticConfig.model_validate(config.model_dump()).actor_train.training_args.max_steps == 65
    # step-wise rows: the count follows the episodes' turns; a decaying schedule must be sized by hand
    with pytest.raises(ValueError, match=r"set actor_train.training_args.max_steps"):
        _config("LakeStep", ppo_mini_batch_size=3, adv_estimator="gigpo", **cosine)
    sized = {"actor_train": {"model_args": ROLE, "training_args": {"lr_scheduler_type": "cosine", "max_steps": 500}}}
    assert (
        _config("LakeStep", ppo_mini_batch_size=3, adv_estimator="gigpo", **sized).actor_train.training_args.max_steps
        == 500
    )
    constant = _config("LakeStep", ppo_mini_batch_size=3, adv_estimator="gigpo", max_steps=10)
    assert constant.actor_train.training_args.max_steps == 10  # a constant rate does not read it


def test_the_critics_schedule_is_sized_as_its_rl_steps():
    # Only actor_train's schedule was sized: a critic with a decaying schedule (ROLL's gae examples give the critic
    # cosine) loaded with max_steps None and failed at its workers' start ("training_args.max_steps is needed for
    # lr_scheduler_type='cosine'"). The critic trains with actor_train's plan in every RL step, not in the warm-up.
    def role(**training):
        return {"model_args": ROLE, "training_args": {"lr_scheduler_type": "cosine", **training}}

    critic = {**role(), "strategy_args": {"strategy_name": "hf_infer"}}
    config = _config(
        adv_estimator="gae", critic=critic, max_steps=10, ppo_epochs=2, ppo_mini_batch_size=3, warmup={"steps": 5}
    )
    assert config.critic.training_args.max_steps == 10 * 2 * 3
    assert config.actor_train.training_args.max_steps == 10 * 2 * 3 + 5
    sized = {**role(max_steps=7), "strategy_args": {"strategy_name": "hf_infer"}}
    assert _config(adv_estimator="gae", critic=sized).critic.training_args.max_steps == 7


def test_warmup_learning_rate_needs_a_strategy_that_can_change_it():
    warm = {"steps": 5, "learning_rate": 1e-3}
    trained = {"model_args": ROLE, "strategy_args": {"strategy_name": "fsdp2_train"}}
    assert _config(warmup=warm, actor_train=trained).warmup.learning_rate == 1e-3
    megatron = {"model_args": ROLE, "strategy_args": {"strategy_name": "megatron_train"}}
    with pytest.raises(
        ValueError,
        match=r"warmup.learning_rate needs actor_train on a backend .* \(fsdp2_train\); it runs megatron_train",
    ):
        _config(warmup=warm, actor_train=megatron)
    with pytest.raises(ValueError, match="greater than 0"):
        _config(warmup={"steps": 5, "learning_rate": 0.0})


def test_a_kl_loss_without_a_reference_role_names_the_fix():
    with pytest.raises(ValueError, match=r"no reference role is configured: add `reference:` with actor_train's"):
        _config(kl={"use_loss": True})
    reference = {"model_args": ROLE, "strategy_args": {"strategy_name": "hf_infer"}}
    assert _config(kl={"use_loss": True}, reference=reference).needs_reference


def test_warm_up_regroups_the_training_envs_one_layout_per_episode_by_default(tokenizer):
    two_tags = {"Lake": ENVS["Lake"], "Lake2": ENVS["Lake"]}
    manager = {"num_env_groups": 8, "group_size": 4, "tags": ["Lake", "Lake2"], "num_groups_partition": [3, 5]}
    config = _config(custom_envs=two_tags, train_env_manager=manager, rollout_batch_size=32, warmup={"steps": 1})
    warm = config.warmup_env_manager()
    assert (warm.num_env_groups, warm.group_size, warm.num_groups_partition) == (32, 1, [12, 20])
    assert warm.num_envs == config.train_env_manager.num_envs and warm.tags == ["Lake", "Lake2"]
    pairs = _config(custom_envs=two_tags, train_env_manager=manager, rollout_batch_size=32, warmup={"group_size": 2})
    assert pairs.warmup_env_manager().num_groups_partition == [6, 10]
    assert config.train_env_manager.group_size == 4  # RL keeps its groups
    with pytest.raises(ValueError, match=r"warmup.group_size=3 must divide train_env_manager.group_size=4"):
        _config(warmup={"steps": 1, "group_size": 3})
    # a noise-free planner on the regrouped envs: every episode its own layout (with the groups: 4 copies of each)
    lake = {"Lake": CustomEnvConfig(env_type="frozen_lake", max_steps=6, max_tokens_per_step=16)}
    single = _config(train_env_manager={"num_env_groups": 4, "group_size": 4, "tags": ["Lake"]}, rollout_batch_size=16)
    for shape, layouts in ((single.warmup_env_manager(), 16), (single.train_env_manager, 4)):
        client = MockPolicyClient(tokenizer, FrozenLakeExpert(noise=0.0), seed=0)
        scheduler = RolloutScheduler.local(
            shape, lake, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16), sequence_length=2048
        )
        try:
            batch = scheduler.get_batch(16).batch
        finally:
            scheduler.close()
        assert batch is not None
        first_turns = {tuple(row[row != tokenizer.pad_token_id].tolist()) for row in batch.batch["prompts"]}
        assert len(batch) == 16 and len(first_turns) == layouts


def test_pipelines_are_declared_as_entry_points_and_resolve():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["roll.pipelines"]
    assert declared == PIPELINE_ENTRY_POINTS
    for target in declared.values():
        assert isinstance(import_target(target).config_cls, type)
    register_pipelines()
    from roll.pipelines.registry import resolve_pipeline

    assert resolve_pipeline("agentic").config_cls is AgenticConfig


@pytest.mark.parametrize(
    ("recipe", "layout"),
    [
        ("agentic-frozenlake-tiny", "traj"),
        ("agentic-frozenlake-gigpo-tiny", "step"),
        ("agentic-sokoban-tiny", "traj"),
        ("agentic-tool-use-tiny", "traj"),
    ],
)
def test_recipes_load(recipe, layout):
    register_pipelines()
    config = load_config(recipe)
    assert isinstance(config, AgenticConfig)
    assert config.layout == layout
    assert config.val_env_manager is not None
    train_tags, val_tags = set(config.train_env_manager.tags), set(config.val_env_manager.tags)
    for tag in train_tags:  # validation plays held-out layouts/questions, never the training split
        assert config.custom_envs[tag].env_config.get("split") == "train"
    for tag in val_tags:
        assert config.custom_envs[tag].env_config.get("split") == "val"


def _group_of_one(tag: str = "Lake", **extra) -> AgenticConfig:
    return _config(tag, train_env_manager={"num_env_groups": 8, "group_size": 1, "tags": [tag]}, **extra)


def test_grpo_with_groups_of_one_runs_as_roll_unless_every_advantage_is_zero():
    # ROLL's frozen-lake demos: grpo, group_size 1, reward_normalization {grouping: tags, method: identity}
    config = _group_of_one(reward_normalization={"grouping": "tags", "method": "identity"})
    assert config.advantage.estimator == "grpo" and config.reward_normalization.grouping == "tag"
    _group_of_one(reward_normalization={"grouping": "batch", "method": "mean_std"})
    with pytest.raises(ValueError, match="normalizes each episode against itself: every advantage is 0"):
        _group_of_one()  # grpo's default normalization: per episode group
    with pytest.raises(ValueError, match="group_size >= 2"):
        _group_of_one("LakeStep", adv_estimator="gigpo")


def test_async_and_rollout_mock_keys():
    config = _config(async_generation_ratio=1, rollout_mock={"enable": True, "mode": "dump", "dump_dir": "/tmp/d"})
    assert config.asynchrony.enabled and config.asynchrony.generation_ratio == 1
    assert config.rollout_mock.mode == "dump"
    assert not _config(async_generation_ratio=0).asynchrony.enabled  # 0: ROLL's synchronous default
    with pytest.raises(ValueError, match="model_update_frequency=1"):
        _config(async_generation_ratio=1, model_update_frequency=2)
    with pytest.raises(ValueError, match="turn asynchronous generation off"):
        _config(async_generation_ratio=1, rollout_mock={"enable": True, "mode": "mock"})


def test_roll_validate_checks_each_env_entry_without_building() -> None:
    # A misspelled env_config key or tool, or an env class that does not import, is found by `roll validate` (and at
    # the start of a run), not minutes later inside the env workers.
    envs = {"Lake": {"env_type": "frozen_lake", "env_config": {"size": 3}}}
    config = _config(custom_envs=envs)
    not_here = "actor_train.model_args.model_name_or_path='/models/tiny' does not exist and is not a hub id"
    lines = [line for check in config.deployment_checks() if (line := check())]  # None: nothing to report
    assert lines[0] == "Lake: env_type 'frozen_lake' (FrozenLakeEnv)"
    # then sequence_length against the model and the first prompt (roll.agentic.pipeline.lengths): no model here
    assert [line.split(" (")[0] for line in lines[1:]] == [
        "actor_train.model_args.model_name_or_path: sequence_length not checked against the model's positions",
        "Lake: first prompt not checked here",
    ]
    assert all(not_here in line for line in lines[1:])
    cases = [
        ({"env_type": "frozen_lake", "env_config": {"sise": 3}}, r"custom_envs\.Lake: env_config .*'sise'.*'size'"),
        ({"env_type": "collections:NoSuchEnv"}, r"custom_envs\.Lake: env_type 'collections:NoSuchEnv' cannot be"),
        (
            {"env_type": "frozen_lake", "tool_wrapper": {"tool_configs": [{"tool_id": "pyhton_code"}]}},
            r"custom_envs\.Lake: unknown tool 'pyhton_code'",
        ),
    ]
    for spec, error in cases:
        checks = _config(custom_envs={"Lake": spec}).deployment_checks()
        with pytest.raises(ConfigError, match=error):
            for check in checks:
                check()


def test_a_tag_missing_from_custom_envs_names_the_yaml_key() -> None:
    with pytest.raises(ValueError, match=r"val_env_manager\.tags \['Laek'\] are not in custom_envs \(\['Lake', "):
        _config(val_env_manager={"num_env_groups": 1, "tags": ["Laek"]})


def test_validation_asked_for_without_a_val_env_manager_is_warned(caplog) -> None:
    with caplog.at_level("WARNING", logger="roll.agentic.pipeline.config"):
        _config(eval_steps=5)
    assert "eval_steps=5, val_batch_size=None, but there is no val_env_manager: this run never validates" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="roll.agentic.pipeline.config"):
        _config(val_env_manager={"num_env_groups": 1, "tags": ["Lake"]}, eval_steps=5)
    assert "val_env_manager" not in caplog.text


def test_pipeline_system_envs_reach_the_env_workers_under_their_own():
    """Top-level ``system_envs`` reached every role but not the env managers, whose workers run the envs and tools
    that read such variables (an API key, ``SEARCH_URL``); a manager's own value wins."""
    from roll.agentic.pipeline.rollout_only import AgenticRolloutConfig

    shared = {"OPENREWARD_API_KEY": "k", "SEARCH_URL": "http://a"}
    config = _config(
        system_envs=shared,
        val_env_manager={"num_env_groups": 1, "group_size": 1, "tags": ["Lake"], "system_envs": {"SEARCH_URL": "b"}},
    )
    assert config.train_env_manager.system_envs == shared == config.actor_train.system_envs
    assert config.val_env_manager.system_envs == {"OPENREWARD_API_KEY": "k", "SEARCH_URL": "b"}
    rollout = AgenticRolloutConfig.model_validate(
        {
            "actor_infer": {"model_args": ROLE},
            "custom_envs": ENVS,
            "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["Lake"]},
            "rollout_batch_size": 1,
            "system_envs": shared,
        }
    )
    assert rollout.train_env_manager.system_envs == shared
    assert _config().train_env_manager.system_envs == {}


def test_the_critics_value_clip_is_a_setting():
    critic = {"model_args": ROLE, "strategy_args": {"strategy_name": "hf_infer"}}
    assert _config(adv_estimator="gae", critic=critic).critic_settings().value_clip == 0.5  # roll's (RLVR's) default
    config = _config(adv_estimator="gae", critic=critic, value_clip=None)
    assert config.value_loss.clip is None and config.critic_settings().value_clip is None


def test_agentic_rollouts_batch_must_fit_max_traj_per_env_when_the_config_loads():
    # The rollout-only config checked only that rollout.batch_size was whole groups: a batch over num_env_groups x
    # max_traj_per_env passed and failed in the scheduler's first get_batch, after the workers had started.
    from roll.agentic.pipeline.rollout_only import AgenticRolloutConfig

    def rollout(batch_size: int, **manager) -> AgenticRolloutConfig:
        return AgenticRolloutConfig.model_validate(
            {
                "actor_infer": {"model_args": ROLE},
                "custom_envs": ENVS,
                "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"], **manager},
                "rollout_batch_size": batch_size,
            }
        )

    assert rollout(8, max_traj_per_env=2).rollout.batch_size == 8
    with pytest.raises(ValueError, match=r"rollout_batch_size\)=8 needs 4 groups.*max_traj_per_env=1"):
        rollout(8, max_traj_per_env=1)
    with pytest.raises(ValueError, match=r"multiple of train_env_manager.group_size=2"):
        rollout(3)


def test_a_training_file_run_as_agentic_rollout_gets_one_error_naming_its_training_keys():
    """``pipeline_cls=agentic_rollout`` on an agentic recipe gave one unknown-field line per training key (ten for
    the FrozenLake recipe); now one error names them, what agentic_rollout does, and the two ways out."""
    register_pipelines()
    with pytest.raises(ConfigError) as caught:
        load_config("agentic-frozenlake-tiny", ["pipeline_cls=agentic_rollout"])
    message = str(caught.value)
    assert "1 configuration error" in message and "unknown field" not in message
    assert (
        "actor_train, adv_estimator, kl, policy_loss, ppo_epochs, reference, reward_normalization, val_batch_size, "
        "val_env_manager, warmup: keys of the agentic (training) pipeline; agentic_rollout plays train_env_manager's "
        "episodes with actor_infer and trains nothing (mode: val replays the same seeds every step): remove them, or "
        "run pipeline_cls: agentic"
    ) in message


def test_a_take_timeout_without_asynchronous_rollouts_is_warned(caplog) -> None:
    """asynchrony.take_timeout_s only bounds BackgroundRollouts.take; a synchronous run ignored it without a word."""
    with caplog.at_level("WARNING", logger="roll.agentic.pipeline.config"):
        _config(asynchrony={"take_timeout_s": 600})
    assert "asynchrony.take_timeout_s=600 is ignored" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="roll.agentic.pipeline.config"):
        config = _config(asynchrony={"take_timeout_s": 600}, async_generation_ratio=1)
    assert config.asynchrony.take_timeout_s == 600 and "take_timeout_s" not in caplog.text


def test_max_traj_per_env_with_asynchronous_rollouts_is_warned(caplog) -> None:
    """Asynchronous rounds play continuously, so the per-request cap of max_traj_per_env has nothing to cap: a run that
    set it took no note of it."""
    manager = {"num_env_groups": 2, "group_size": 4, "tags": ["Lake"]}
    with caplog.at_level("WARNING", logger="roll.agentic.pipeline.config"):
        _config(async_generation_ratio=1, train_env_manager={**manager, "max_traj_per_env": 2})
    assert "train_env_manager.max_traj_per_env=2 is ignored" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="roll.agentic.pipeline.config"):
        _config(train_env_manager={**manager, "max_traj_per_env": 2})
    assert "max_traj_per_env" not in caplog.text
