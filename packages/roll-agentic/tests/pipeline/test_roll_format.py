"""A ROLL-format agentic file (no pipeline_cls) through roll's ROLL loader: inferred as agentic (or the rollout
pipeline without actor_train), ROLL's keys mapped or ignored with ROLL's reasons, and loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config

AGENTIC = """
hydra: {run: {dir: .}}
exp_name: lake
rollout_batch_size: 8
val_batch_size: 8
sequence_length: 1024
adv_estimator: grpo
init_kl_coef: 0.2
render_save_dir: ./output/render
all_response_pattern: &pattern "<answer>(.*)</answer>"
actor_train:
  model_args: {model_name_or_path: tiny://nano, dtype: fp32}
  data_args: {template: qwen2_5}
  strategy_args: {strategy_name: fsdp2_train}
  device_mapping: list(range(0,1))
actor_infer:
  model_args: {model_name_or_path: tiny://nano}
  generating_args: {max_new_tokens: 16}
  data_args: {template: qwen2_5}
  strategy_args: {strategy_name: hf_infer}
  device_mapping: list(range(0,1))
train_env_manager:
  format_penalty: -0.1
  num_env_groups: 2
  group_size: 4
  tags: [Lake]
custom_envs:
  Lake: {env_type: frozen_lake, env_manager_cls: traj}
"""


@pytest.fixture
def lake_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent_val_lake.yaml"
    path.write_text(AGENTIC)
    return path


def test_agentic_roll_file_loads_with_rolls_meaning(lake_file: Path) -> None:
    data, referenced = compose_file(lake_file)
    translation = translate(data, referenced)
    assert translation.pipeline == "agentic" and "env managers" in translation.reason
    assert translation.problems == []
    rows = {row.key: row for row in translation.rows}
    assert rows["init_kl_coef"].status == "mapped" and rows["init_kl_coef"].target == "kl.init_coef"
    assert rows["train_env_manager.format_penalty"].status == "ignored"
    assert rows["all_response_pattern"].status == "ignored"
    config = load_config(lake_file)
    assert config.pipeline_cls == "agentic"
    assert config.actor_train.data_args is None  # ROLL's template-only data_args: envs make the prompts
    assert config.rollout.batch_size == 8 and config.train_env_manager.group_size == 4


def test_without_actor_train_it_is_the_rollout_pipeline(lake_file: Path) -> None:
    data, referenced = compose_file(lake_file)
    del data["actor_train"]
    assert translate(data, referenced).pipeline == "agentic_rollout"


def test_agentic_keys_roll_lacks_are_listed(lake_file: Path) -> None:
    data, referenced = compose_file(lake_file)
    data.update({"reward_clip": 20, "batch_adjust_mode": "random_sample", "adv_estimator": "gigpo"})
    problems = {row.key for row in translate(data, referenced).problems}
    # gigpo is an agentic estimator roll has; random_sample is ROLL's batch adjustment (roll.agentic.pipeline.adjust)
    assert problems == set()  # reward_clip is implemented too (advantage.reward_clip)


def test_agentic_random_sample_is_mapped() -> None:
    data = {
        "batch_adjust_mode": "random_sample",
        "actor_train": {"model_args": {"model_name_or_path": "/m"}},
        "actor_infer": {"model_args": {"model_name_or_path": "/m"}},
        "train_env_manager": {"tags": ["Lake"]},
    }
    translation = translate(data)
    row = next(row for row in translation.rows if row.key == "batch_adjust_mode")
    assert (row.status, row.target) == ("mapped", "update.batch_adjust_mode")
    assert translation.data["batch_adjust_mode"] == "random_sample"


def test_add_token_level_kl_puts_rolls_kl_penalty_into_the_reward(lake_file: Path) -> None:
    # ROLL's agentic pipeline subtracts init_kl_coef x KL(kl_penalty, default 'kl') from the token rewards
    # (compute_token_reward); its actor's KL loss is k3 whatever kl_penalty says. It used to be dropped as "ignored".
    reference = (
        "reference:\n  model_args: {model_name_or_path: tiny://nano}\n  strategy_args: {strategy_name: hf_infer}\n"
    )
    lake_file.write_text(AGENTIC + "add_token_level_kl: true\nuse_kl_loss: true\n" + reference)
    rows = {row.key: row for row in translate(*compose_file(lake_file)).rows}
    assert rows["add_token_level_kl"].status == "mapped" and rows["add_token_level_kl"].target == "kl.in_reward"
    config = load_config(lake_file)
    kl = config.kl
    assert (kl.in_reward, kl.init_coef, kl.penalty, kl.loss_penalty) == (True, 0.2, "kl", "k3")
    assert config.needs_reference and config.actor_settings().kl_penalty == "k3"


def test_the_rollout_pipeline_ignores_the_reward_kl(lake_file: Path) -> None:
    data, referenced = compose_file(lake_file)
    del data["actor_train"]
    data["add_token_level_kl"] = True
    rows = {row.key: row for row in translate(data, referenced).rows}
    assert rows["add_token_level_kl"].status == "ignored" and "trains nothing" in rows["add_token_level_kl"].note
