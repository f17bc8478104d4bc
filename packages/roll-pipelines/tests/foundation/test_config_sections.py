"""Pipeline configs in sections: every recipe loads, old flat (ROLL-style) keys land in their sections, a setting
given twice is an error, dumps show sections and load back to the same config, and nothing is changed after
validation (asset resolution builds a new config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.pipelines.config import load_config
from roll.pipelines.dpo import DPOConfig
from roll.pipelines.launcher import prepare_config
from roll.pipelines.recipes import list_recipes
from roll.pipelines.rlvr import FLAT_KEYS, RLVRConfig
from roll.pipelines.sft import SFTConfig
from roll.runtime import ConfigError

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}

# rlvr-tiny as it was written before sections: every algorithm setting a flat top-level key.
FLAT_RLVR_TINY = """
pipeline_cls: rlvr
exp_name: rlvr-tiny
seed: 42
max_steps: 30
eval_steps: 5
save_steps: 0
logging_steps: 1
rollout_batch_size: 16
prompt_length: 64
response_length: 40
adv_estimator: grpo
ppo_epochs: 1
loss_agg_mode: token-mean
val_batch_size: 256
actor_train:
  world_size: 1
  model_args: {model_name_or_path: recipe://rlvr-tiny-warmup, dtype: float32}
  training_args: {learning_rate: 5.0e-5, per_device_train_batch_size: 32, max_grad_norm: 1.0}
  data_args:
    file_name: synthetic://arithmetic_prompts?n=8000&seed=1&split=train&max_operand=99&ops=add
    eval_file_name: synthetic://arithmetic_prompts?n=256&seed=1&split=eval&max_operand=99&ops=add
    extra_keys: [ground_truth]
  infer_batch_size: 64
  strategy_args: {strategy_name: fsdp2_train}
actor_infer:
  world_size: 1
  model_args: {model_name_or_path: recipe://rlvr-tiny-warmup, dtype: float32}
  generating_args: {temperature: 1.0, num_return_sequences: 8}
  strategy_args: {strategy_name: vllm, strategy_config: {max_model_len: 128, kv_cache_space_gb: 1}}
rewards:
  math: {reward_type: math, reward_kwargs: {require_boxed: true}, world_size: 1}
"""

# One distinct, valid value for every flat RLVR key.
FLAT_VALUES: dict[str, Any] = {
    "rollout_batch_size": 7,
    "prompt_length": 33,
    "response_length": 9,
    "domain_interleave_probs": {"math": 1.0},
    "model_update_frequency": 2,
    "rollout_dump": True,
    "ppo_epochs": 3,
    "ppo_mini_batch_size": 5,
    "critic_warmup": 1,
    "adv_estimator": "gae",
    "gamma": 0.9,
    "lambd": 0.8,
    "norm_std": False,
    "reward_norm": "batch",
    "reward_clip": 4.0,
    "whiten_advantages": True,
    "advantage_clip": 3.0,
    "kl_penalty": "k1",
    "add_token_level_kl": True,
    "use_kl_loss": True,
    "init_kl_coef": 0.2,
    "kl_ctrl_type": "adaptive",
    "target_kl": 0.1,
    "kl_horizon": 100,
    "kl_loss_coef": 0.01,
    "pg_clip": 0.3,
    "pg_clip_low": 0.1,
    "pg_clip_high": 0.4,
    "dual_clip_loss": 3.0,
    "importance_sampling": "sequence",
    "loss_agg_mode": "seq-mean-token-mean",
    "entropy_loss_coef": 0.02,
    "value_clip": 0.6,
    "tis_cap": 2.0,
    "tis_level": "sequence",
    "tis_mode": "mask",
    "enable_old_logprobs_recompute": True,
    "dynamic_sampling": True,
    "max_num_gen_batches": 6,
    "mask_truncated": True,
    "norm_mean_type": "group",
    "norm_std_type": "batch",
    "difficulty_mask": True,
    "difficulty_low_threshold": 0.1,
    "difficulty_high_threshold": 0.9,
    "error_max_len_clip": True,
    "error_max_len_threshold": 100,
    "overlong_buffer_len": 4,
    "overlong_penalty_factor": 0.5,
    "val_batch_size": 11,
    "val_generating_args": {"temperature": 0.7, "num_return_sequences": 3},
    "async_generation_ratio": 2,
    "is_pure_opd": False,
    "use_opd": False,
    "opd_kl_penalty": "k3",
    "whiten_rewards": True,
    "pg_variant": "topr",
    "difficulty_loss_weight": True,
    "length_loss_weight": True,
    "topr_positive_weight": 0.7,
    "topr_negative_weight": 0.3,
    "rl_loss_coef": 0.5,
    "postive_loss_coef": 0.25,
    "use_topr_neg_loss_coef": 0.75,
}


def _rlvr(**changes: Any) -> dict[str, Any]:
    return {
        "pipeline_cls": "rlvr",
        "actor_train": {**ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
        "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
        "rewards": {"math": {"reward_type": "math"}},
        **changes,
    }


def _at(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


@pytest.mark.parametrize("name", sorted(list_recipes()))
def test_every_recipe_loads_and_its_dump_round_trips(name: str, tmp_path: Path) -> None:
    config = load_config(name)
    dumped = config.model_dump(mode="json")
    flat = {key for key, path in type(config).flat_keys.items() if path.split(".")[0] != key}
    assert not set(dumped) & flat  # the dump is in sections, no flat key left
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dumped, sort_keys=False))  # what a run writes to output_dir/config.yaml
    again = load_config(path)
    assert type(again) is type(config) and again == config


def test_an_old_flat_rlvr_config_loads_into_sections(tmp_path: Path) -> None:
    path = tmp_path / "flat.yaml"
    path.write_text(FLAT_RLVR_TINY)
    flat = load_config(path)
    assert isinstance(flat, RLVRConfig) and flat == load_config("rlvr-tiny")
    assert (flat.rollout.batch_size, flat.rollout.prompt_length, flat.rollout.response_length) == (16, 64, 40)
    assert flat.advantage.estimator == "grpo" and flat.update.epochs == 1 and flat.validation.batch_size == 256
    assert flat.actor_infer.generating_args.max_new_tokens == 40  # the rollout budget reaches the engine
    assert flat.actor_train.training_args.max_steps == 30  # one update per step
    # Overrides of flat keys land in the sections too, over the file's values.
    changed = load_config(path, ["rollout_batch_size=4", "adv_estimator=rloo", "rollout.prompt_length=48"])
    assert (changed.rollout.batch_size, changed.advantage.estimator, changed.rollout.prompt_length) == (4, "rloo", 48)
    sectioned = load_config("rlvr-tiny", ["rollout_batch_size=4", "dynamic_sampling=true"])
    assert sectioned.rollout.batch_size == 4 and sectioned.dynamic_sampling.enabled


def test_every_flat_rlvr_key_lands_in_its_section() -> None:
    assert set(FLAT_VALUES) == set(FLAT_KEYS)
    config = RLVRConfig.model_validate(_rlvr(reference=ROLE, critic=ROLE, **FLAT_VALUES))
    for flat, path in FLAT_KEYS.items():
        value = _at(config, path)
        if flat == "val_generating_args":
            assert (value.temperature, value.num_return_sequences) == (0.7, 3)
        else:
            assert value == FLAT_VALUES[flat], (flat, path, value)
    settings = config.actor_settings()
    assert (settings.clip_low, settings.clip_high, settings.dual_clip, settings.kl_loss_coef) == (0.1, 0.4, 3.0, 0.01)
    assert config.critic_settings().value_clip == 0.6
    # 7 prompts x 2 samples in mini-batches of 5 -> 3 updates per epoch, 3 epochs, 100 steps.
    assert config.actor_train.training_args.max_steps == config.critic.training_args.max_steps == 900


def test_sft_and_dpo_flat_keys() -> None:
    sft = {
        "pipeline_cls": "sft",
        "val_batch_size": 9,
        "sft_train": {**ROLE, "data_args": {"file_name": "x", "max_length": 8}},
    }
    assert SFTConfig.model_validate(sft).validation.batch_size == 9
    dpo = load_config(
        {
            "pipeline_cls": "dpo",
            "beta": 0.3,
            "loss_type": "ipo",
            "actor_train": {
                **ROLE,
                "training_args": {"per_device_train_batch_size": 2},
                "data_args": {"file_name": "x", "max_length": 8},
            },
            "reference": ROLE,
        },
        ["label_smoothing=0.1"],
    )
    assert isinstance(dpo, DPOConfig)
    assert (dpo.loss.beta, dpo.loss.loss_type, dpo.loss.label_smoothing) == (0.3, "ipo", 0.1)


@pytest.mark.parametrize(
    ("flat", "section"),
    [
        ({"rollout_batch_size": 8}, {"rollout": {"batch_size": 8}}),  # even with the same value
        ({"adv_estimator": "rloo"}, {"advantage": {"estimator": "grpo"}}),
        ({"max_num_gen_batches": 3}, {"dynamic_sampling": {"max_generation_rounds": 2}}),
    ],
)
def test_a_setting_given_flat_and_in_its_section_is_an_error(flat: dict, section: dict, tmp_path: Path) -> None:
    (name,) = flat
    with pytest.raises(ConfigError, match=rf"{name} and {FLAT_KEYS[name]} are the same setting.*keep only"):
        RLVRConfig.model_validate(_rlvr(**flat, **section))
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(_rlvr(**flat, **section)))
    with pytest.raises(ConfigError, match=rf"twice.yaml: {name} and {FLAT_KEYS[name]}"):
        load_config(path)


def test_a_budget_given_twice_must_agree() -> None:
    with pytest.raises(
        ConfigError, match="response_length=8 contradicts actor_infer.generating_args.max_new_tokens=16"
    ):
        RLVRConfig.model_validate(
            _rlvr(response_length=8, actor_infer={**ROLE, "generating_args": {"max_new_tokens": 16}})
        )


def test_unknown_flat_looking_keys_get_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="did you mean 'rollout_batch_size'"):
        load_config(_rlvr(rollout_batch_sise=8))


def test_asset_resolution_builds_a_new_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path))
    config = load_config(_rlvr())
    before = config.model_dump()
    resolved = prepare_config(config)
    assert config.model_dump() == before  # the loaded config is untouched
    model = Path(resolved.actor_train.model_args.model_name_or_path)
    assert model.is_dir() and model.is_relative_to(tmp_path)
    assert Path(resolved.actor_train.data_args.file_name).is_file()
    assert resolved.actor_infer.model_args.model_name_or_path == str(model)  # one build per distinct reference
    # Everything else is the same, including which fields were set (llm_judge checks generating_args that way).
    assert resolved.rollout == config.rollout and resolved.rewards["math"].name == "rewards_math"
    assert resolved.actor_infer.model_fields_set == config.actor_infer.model_fields_set
