"""The generated docs (config reference, ROLL key table) match the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipelines.compat.docs import config_reference, roll_compat

DOCS = Path(__file__).resolve().parents[4] / "docs"


@pytest.mark.parametrize(
    ("name", "render"), [("config-reference.md", config_reference), ("roll-compat.md", roll_compat)]
)
def test_generated_doc_is_current(name, render):
    assert (DOCS / name).read_text() == render(), (
        f"docs/{name} is out of date: run `python -m roll.pipelines.compat.docs docs` from the repository root"
    )


def test_reference_lists_every_rlvr_section_field_with_its_roll_alias():
    from roll.pipelines.rlvr.config import FLAT_KEYS, RLVRConfig

    text = config_reference()
    for name in RLVRConfig.model_fields:
        assert f"| `{name}` |" in text
    for flat, path in FLAT_KEYS.items():
        line = next(line for line in text.splitlines() if line.startswith(f"| `{path}` |"))
        assert f"`{flat}`" in line


def test_every_ppo_knob_of_the_issue_has_a_status():
    knobs = [
        "num_return_sequences_in_group",
        "adv_estimator",
        "norm_mean_type",
        "norm_std_type",
        "whiten_rewards",
        "reward_norm",
        "reward_shift",
        "reward_scale",
        "kl_penalty",
        "enable_reference",
        "train_infer_correction",
        "max_len_mask",
        "difficulty_mask",
        "difficulty_low_threshold",
        "difficulty_high_threshold",
        "error_max_len_clip",
        "difficulty_loss_weight",
        "length_loss_weight",
        "rpc_timeout",
        "logging_dir",
        "checkpoint_config",
        "sequence_length",
        "system_envs",
        "num_gpus_per_node",
    ]
    role_knobs = [
        "pg_variant",
        "query_filter_config",
        "use_dynamic_batching_in_train",
        "use_dynamic_batching_in_infer",
        "max_tokens_per_microbatch_in_train",
        "max_tokens_per_microbatch_in_infer",
        "sequence_length_round_in_train",
        "sequence_length_round_in_infer",
        "use_sequence_packing",
        "use_remove_padding",
    ]
    text = roll_compat()
    for knob in knobs:
        assert f"| `{knob}` |" in text or f"`{knob}`" in text, knob
    for knob in role_knobs:
        assert f"| `<role>.{knob}` |" in text, knob
