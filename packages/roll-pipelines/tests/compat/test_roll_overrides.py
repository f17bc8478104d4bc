"""Command-line overrides of a ROLL file: ROLL's keys and values are applied to the file before its ``${...}`` are
resolved and it is translated (as Hydra does); roll's own fields keep their roll meaning."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.config import load_config, read_config_source
from roll.runtime import ConfigError

TINY = Path(__file__).parent / "fixtures" / "tiny" / "rlvr_tiny.yaml"


def test_rolls_keys_on_the_command_line_are_translated_with_the_file() -> None:
    # These used to fail: "pretrain: unknown field; did you mean 'actor_train'?", "dtype ... (got: 'bf16')".
    overrides = [
        "pretrain=tiny://nano?seed=1",  # a ROLL key roll has no field for
        "response_length=6",  # a flat key the file interpolates: ${response_length} follows it
        "actor_train.model_args.dtype=bf16",  # ROLL's value name inside a role
        "actor_train.model_args.disable_gradient_checkpointing=false",  # ROLL's key name inside a role
    ]
    config = load_config(TINY, overrides)
    assert config.actor_train.model_args.model_name_or_path == "tiny://nano?seed=1"
    assert config.actor_infer.model_args.model_name_or_path == "tiny://nano?seed=1"
    assert config.actor_infer.generating_args.max_new_tokens == 6 and config.rollout.response_length == 6
    assert config.actor_train.model_args.dtype == "bfloat16"
    assert config.actor_train.model_args.gradient_checkpointing is True


def test_rolls_own_fields_still_override_after_translation() -> None:
    config = load_config(TINY, ["rollout.batch_size=4", "max_steps=3"])
    assert (config.rollout.batch_size, config.max_steps) == (4, 3)
    assert load_config(TINY, ["rollout_batch_size=6"]).rollout.batch_size == 6  # ROLL's flat key, translated
    _, _, translation = read_config_source(TINY, ["pretrain=tiny://nano?seed=1", "max_steps=3"])
    assert translation is not None and translation.applied_overrides == ["pretrain=tiny://nano?seed=1"]


def test_a_misspelled_roll_key_override_is_reported_with_the_nearest_key() -> None:
    with pytest.raises(ConfigError, match=r"max_stepz: unknown: unknown key; did you mean 'max_steps'\?"):
        load_config(TINY, ["max_stepz=3"])


def test_an_override_adding_a_role_does_not_change_the_inferred_pipeline(tmp_path: Path) -> None:
    # A ROLL file with only a rollout engine stays the rollout pipeline; the added role is reported by name.
    path = tmp_path / "rollout.yaml"
    path.write_text(
        "actor_infer:\n  model_args: {model_name_or_path: tiny://nano}\n  strategy_args: {strategy_name: hf_infer}\n"
    )
    _, _, translation = read_config_source(path, ["actor_train.world_size=1"])
    assert translation is not None and translation.pipeline == "rlvr_rollout"
    assert "only a rollout engine" in translation.reason
    assert [row.key for row in translation.problems] == ["actor_train"]


def test_rolls_validation_data_files_override_the_section_roll_also_has() -> None:
    # roll's config has a `validation` section too (batch size, generation), without data_args: this override
    # used to be applied after translation and fail with "validation.data_args: unknown field"
    item = "validation.data_args.file_name=synthetic://arithmetic_prompts?n=4&seed=2&split=test"
    config = load_config(TINY, [item, "validation.generating_args.temperature=0.5"])
    assert config.actor_train.data_args is not None
    assert config.actor_train.data_args.eval_file_name == "synthetic://arithmetic_prompts?n=4&seed=2&split=test"
    assert config.validation.generating_args is not None and config.validation.generating_args.temperature == 0.5
    _, _, translation = read_config_source(TINY, [item])
    assert translation is not None and translation.applied_overrides == [item]
