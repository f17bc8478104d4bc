"""ROLL keys whose value decides what roll does: track_with's tracker names."""

from __future__ import annotations

import pytest

from roll.pipelines.compat import translate

SFT = {
    "sft_train": {
        "data_args": {"file_name": ["data/sft.jsonl"]},
        "strategy_args": {"strategy_name": "fsdp2_train"},
        "device_mapping": "list(range(0,1))",
    }
}


@pytest.mark.parametrize(
    ("value", "status", "out"),
    [("tensorboard", "kept", "tensorboard"), ("wandb", "kept", "wandb"), ("stdout", "renamed", "console")],
)
def test_rolls_tracker_names_map(value: str, status: str, out: str) -> None:
    translation = translate({**SFT, "track_with": value})
    assert translation.data["track_with"] == out
    assert [(row.status, row.target) for row in translation.rows if row.key == "track_with"] == [(status, "track_with")]
    assert translation.problems == []


def test_a_tracker_outside_rolls_open_source_registry_fails_as_in_roll() -> None:
    translation = translate({**SFT, "track_with": "ml_tracker", "tracker_kwargs": {"exp": "x"}})
    assert "track_with" not in translation.data
    [problem] = translation.problems
    assert problem.key == "track_with" and problem.status == "unsupported"
    assert "'ml_tracker' is not in ROLL's open-source tracker registry either" in problem.note
    assert "create_tracker raises 'Unknown tracker name'" in problem.note


def test_a_multimodal_file_fails_with_one_reason() -> None:
    from roll.pipelines.compat.multimodal import multimodal_markers

    data = {
        "actor_train": {"data_args": {"template": "qwen2-vl", "file_name": ["d.jsonl"], "image_folder": "/imgs"}},
        "actor_infer": {"strategy_args": {"strategy_name": "vllm"}},
        "rewards": {"det": {"worker_cls": "roll.pipeline.rlvr.rewards.detection_reward_worker.DetectionRewardWorker"}},
    }
    assert multimodal_markers(data) == [
        "actor_train.data_args.template: qwen2-vl (a vision-language chat template)",
        "actor_train.data_args.image_folder (image data)",
        "rewards.det.worker_cls: ROLL's image-detection reward",
    ]
    [problem] = translate(data).problems
    assert problem.key == "(multimodal)"
    assert problem.note.startswith("roll has no multimodal (image, video or audio) pipeline; this file is multimodal")
    text_only = {"actor_train": {"data_args": {"template": "qwen2_5", "file_name": ["d.jsonl"]}}}
    assert multimodal_markers(text_only) == []


def test_an_empty_file_says_it_is_empty(tmp_path) -> None:
    from roll.pipelines.config import load_config
    from roll.runtime import ConfigError

    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError, match="cannot tell which pipeline this ROLL config is for: it is empty"):
        load_config(path)


def _rlvr(infer_generation: dict) -> dict:
    role = {"strategy_args": {"strategy_name": "fsdp2_train"}, "device_mapping": "list(range(0,1))"}
    return {
        "actor_train": role,
        "actor_infer": {**role, "strategy_args": {"strategy_name": "vllm"}, "generating_args": infer_generation},
        "rewards": {"math": {"worker_cls": "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"}},
    }


def test_sampling_settings_a_file_leaves_out_get_rolls_defaults() -> None:
    """ROLL samples with GeneratingArguments' defaults (temperature 0.95, top_p 0.7, top_k 50) where a file is silent;
    roll's defaults differ, so the translation writes ROLL's in and says so."""
    out = translate(_rlvr({"temperature": 0.6, "num_return_sequences": 4})).data["actor_infer"]["generating_args"]
    assert (out["temperature"], out["top_p"], out["top_k"]) == (0.6, 0.7, 50)
    rows = {row.key: row for row in translate(_rlvr({"top_p": 0.99})).rows}
    assert rows["(actor_infer.generating_args.temperature)"].status == "implemented-as"
    assert "(actor_infer.generating_args.top_p)" not in rows
    greedy = translate(_rlvr({"do_sample": False})).data["actor_infer"]["generating_args"]
    assert greedy["temperature"] == 0.0 and "top_p" not in greedy and "top_k" not in greedy


def test_rolls_qwen3_template_renders_with_enable_thinking_true() -> None:
    # ROLL's chat_template 'qwen3' calls the tokenizer's template with enable_thinking=True; 'native'/'qwen2_5' with
    # the template's default (roll's enable_thinking null)
    qwen3 = translate({"sft_train": {**SFT["sft_train"], "data_args": {"file_name": ["d.jsonl"], "template": "qwen3"}}})
    assert qwen3.data["sft_train"]["data_args"]["enable_thinking"] is True
    [row] = [row for row in qwen3.rows if row.key == "sft_train.data_args.template"]
    assert (row.status, row.target) == ("implemented-as", "sft_train.data_args.enable_thinking")
    native = translate(
        {"sft_train": {**SFT["sft_train"], "data_args": {"file_name": ["d.jsonl"], "template": "native"}}}
    )
    assert "enable_thinking" not in native.data["sft_train"]["data_args"]
    assert qwen3.problems == native.problems == []


def test_qwen3_templates_of_untrained_roles_leave_no_data_args() -> None:
    data = _rlvr({})
    data["actor_train"] = {**data["actor_train"], "data_args": {"file_name": ["d.jsonl"], "template": "qwen3"}}
    data["actor_infer"] = {**data["actor_infer"], "data_args": {"template": "qwen3"}}
    translation = translate(data)
    assert translation.data["actor_train"]["data_args"]["enable_thinking"] is True
    assert "data_args" not in translation.data["actor_infer"]  # ROLL gives every role a template; roll's data is one
