"""ROLL-format files using query_key, freeze_module_prefix and batch_adjust_mode: random_sample load with ROLL's
meaning (the behaviour itself is tested in data/test_query_key.py, roll-strategies' test_freezing.py and
roll-agentic's test_batch_adjust.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.pipelines.assets import resolve_model_uri
from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.pipelines.stages import load_splits
from roll.pipelines.tokenizers import load_tokenizer

SFT = """
hydra:
  run:
    dir: .
  output_subdir: null
exp_name: alpaca-sft
seed: 42
max_steps: 2
sequence_length: 256
pretrain: tiny://nano
prompt_key: instruction
query_key: input
response_key: output
validation:
  data_args:
    file_name: {data}
    template: qwen2_5
sft_train:
  model_args:
    dtype: fp32
    freeze_module_prefix: "model.embed_tokens, model.layers.0"
    ulysses_size: 1
  training_args:
    per_device_train_batch_size: 2
    gradient_accumulation_steps: 1
  data_args:
    file_name: {data}
    template: qwen2_5
    preprocessing_num_workers: 4
  strategy_args:
    strategy_name: fsdp2_train
  device_mapping: list(range(0,1))
"""

ROWS = [
    {"instruction": "Sort the list.", "input": "x = [3, 1, 2]", "output": "sorted(x)"},
    {"instruction": "Say hi.", "input": "", "output": "hi"},
]


def test_alpaca_sft_file_loads_and_encodes_the_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    data_file = tmp_path / "alpaca.json"
    data_file.write_text("\n".join(json.dumps(row) for row in ROWS) + "\n")
    path = tmp_path / "sft_config.yaml"
    path.write_text(SFT.format(data=data_file))
    data, referenced = compose_file(path)
    translation = translate(data, referenced)
    rows = {row.key: row for row in translation.rows}
    assert translation.problems == []
    assert (rows["query_key"].status, rows["query_key"].target) == ("renamed", "sft_train.data_args.query_key")
    assert rows["sft_train.model_args.freeze_module_prefix"].status == "kept"
    config = load_config(path)
    args = config.sft_train.data_args
    assert args is not None
    assert (args.prompt_key, args.query_key, args.response_key) == ("instruction", "input", "output")
    assert config.sft_train.model_args.freeze_module_prefix == ["model.embed_tokens", "model.layers.0"]
    model_args = config.sft_train.model_args
    tokenizer = load_tokenizer(model_args.model_copy(update={"model_name_or_path": resolve_model_uri("tiny://nano")}))
    splits = load_splits(args, "sft", tokenizer)
    texts = [tokenizer.decode(example["input_ids"]) for example in splits.train]
    assert "<|im_start|>user\nSort the list.\nx = [3, 1, 2]<|im_end|>" in texts[0]
    assert "<|im_start|>user\nSay hi.<|im_end|>" in texts[1]


def test_sft_file_without_column_keys_reads_rolls_alpaca_defaults(tmp_path: Path) -> None:
    text = SFT.format(data="train.json").replace("prompt_key: instruction\n", "").replace("response_key: output\n", "")
    path = tmp_path / "sft.yaml"
    path.write_text(text)
    data, referenced = compose_file(path)
    translation = translate(data, referenced)
    assert translation.problems == []
    args = translation.data["sft_train"]["data_args"]
    assert (args["prompt_key"], args["query_key"], args["response_key"]) == ("instruction", "input", "output")
    rows = {row.key: row.status for row in translation.rows}
    assert rows["(prompt_key)"] == rows["(response_key)"] == "implemented-as"


def test_system_key_is_each_rows_system_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ROLL's SFT ``system_key`` (its sft_config.yaml has it commented out) was refused; it renames to the trained
    role's data_args.system_key, and rows carry their system messages (data/test_system_key.py for the rules)."""
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    data_file = tmp_path / "alpaca.json"
    rows = [{**ROWS[0], "system_prompt": "You write Python."}, {**ROWS[1], "system_prompt": ""}]
    data_file.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    path = tmp_path / "sft_config.yaml"
    path.write_text(
        SFT.format(data=data_file).replace(
            "response_key: output\n", "response_key: output\nsystem_key: system_prompt\n"
        )
    )
    rows_ = {row.key: row for row in translate(*compose_file(path)).rows}
    assert (rows_["system_key"].status, rows_["system_key"].target) == ("renamed", "sft_train.data_args.system_key")
    config = load_config(path)
    args = config.sft_train.data_args
    assert args is not None and args.system_key == "system_prompt"
    model_args = config.sft_train.model_args
    tokenizer = load_tokenizer(model_args.model_copy(update={"model_name_or_path": resolve_model_uri("tiny://nano")}))
    texts = [tokenizer.decode(example["input_ids"]) for example in load_splits(args, "sft", tokenizer).train]
    assert texts[0].startswith("<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\nSort the list.")
    assert texts[1].startswith("<|im_start|>user\nSay hi.<|im_end|>")  # an empty one adds no system message
