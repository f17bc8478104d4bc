"""The columns ROLL's DPO and distill pipelines read when a file names none: ROLL's DPO reads its prompt from the
``instruction`` column (its DPOConfig has no key for it), its distill from ``question``/``answer``. A ROLL file run
by roll reads the same columns (SFT's Alpaca defaults are tested in test_roll_sft_keys.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from roll.pipelines.assets import resolve_model_uri
from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.pipelines.stages import load_splits
from roll.pipelines.tokenizers import load_tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
DPO = FIXTURES / "roll" / "qwen2.5-3B_dpo_megatron.yaml"

# ROLL's DPO rows (its docs' example): the prompt in `instruction`, an `input` its DPO does not read
DPO_ROWS = [
    {"instruction": "计算 3 + 4。", "input": "", "chosen": "3 + 4 = 7。", "rejected": "8"},
    {"instruction": "计算 5 * 6。", "input": "ignored by ROLL", "chosen": "5 * 6 = 30。", "rejected": "31"},
]


def test_dpo_file_reads_the_prompt_from_the_instruction_column(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    data, referenced = compose_file(DPO)
    translation = translate(data, referenced)
    row = {row.key: row for row in translation.rows}["(prompt_key)"]
    assert (row.status, row.target) == ("implemented-as", "actor_train.data_args.prompt_key")
    assert row.note == "'instruction': ROLL's dpo reads it"

    rows = tmp_path / "comparison_gpt4_data_zh.json"
    rows.write_text(json.dumps(DPO_ROWS, ensure_ascii=False))
    config = load_config(DPO, ["pretrain=tiny://nano"])
    args = config.actor_train.data_args
    assert args is not None and (args.prompt_key, args.query_key) == ("instruction", None)
    args = args.model_copy(update={"file_name": str(rows), "eval_file_name": None})
    tokenizer = load_tokenizer(
        config.actor_train.model_args.model_copy(update={"model_name_or_path": resolve_model_uri("tiny://nano")})
    )
    examples = load_splits(args, "preference", tokenizer).train
    prompts = [tokenizer.decode(example["prompt_ids"]) for example in examples]
    assert "<|im_start|>user\n计算 3 + 4。<|im_end|>" in prompts[0]
    assert "<|im_start|>user\n计算 5 * 6。<|im_end|>" in prompts[1]
    assert tokenizer.decode(examples[1]["chosen_ids"]).startswith("5 * 6 = 30。")


def test_dpo_file_that_names_a_prompt_column_keeps_it(tmp_path: Path) -> None:
    data, referenced = compose_file(DPO)
    data["actor_train"]["data_args"]["prompt_key"] = "question"  # e.g. an override of roll's field
    translated = translate(data, referenced).data
    assert translated["actor_train"]["data_args"]["prompt_key"] == "question"


DISTILL = {
    "exp_name": "distill",
    "student_pretrain": "tiny://nano",
    "teacher_pretrain": "tiny://nano?seed=1",
    "student": {
        "data_args": {"file_name": ["data/GSM8K_zh.json"], "template": "qwen2_5"},
        "strategy_args": {"strategy_name": "fsdp2_train"},
    },
    "teacher": {"strategy_args": {"strategy_name": "hf_infer"}},
}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({}, ("question", "answer")),
        ({"question_key": "question_zh", "answer_key": "answer_zh"}, ("question_zh", "answer_zh")),
    ],
)
def test_distill_file_reads_rolls_question_and_answer_columns(
    tmp_path: Path, keys: dict[str, str], expected: tuple[str, str]
) -> None:
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump({**DISTILL, **keys}))
    config = load_config(path)
    args = config.student.data_args
    assert args is not None and (args.prompt_key, args.response_key) == expected


# meta-math/GSM8K_zh rows: its train and test rows in one file, with English and Chinese columns
GSM8K_ZH = [
    {
        "question": f"Tom has {n} apples and eats 1. How many are left?",
        "answer": f"{n} - 1 = <<{n}-1={n - 1}>>{n - 1}\n#### {n - 1}",
        "answer_only": str(n - 1),
        "split": split,
        "question_zh": f"汤姆有 {n} 个苹果, 吃了 1 个, 还剩几个?",
        "answer_zh": f"{n} - 1 = {n - 1}\n#### {n - 1}",
    }
    for n, split in [(3, "train"), (4, "test"), (5, "train"), (6, "test"), (7, "train")]
]


def test_distill_file_trains_and_validates_on_the_train_rows_as_roll(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    rows = tmp_path / "GSM8K_zh.json"
    rows.write_text(json.dumps(GSM8K_ZH, ensure_ascii=False))
    file = {**DISTILL, "question_key": "question_zh", "answer_key": "answer_zh"}
    file["student"] = {**DISTILL["student"], "data_args": {"file_name": [str(rows)], "template": "qwen2_5"}}
    file["validation"] = {"data_args": {"file_name": [str(rows)], "template": "qwen2_5"}}
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(file))
    data, referenced = compose_file(path)
    row = {row.key: row for row in translate(data, referenced).rows}["(split)"]
    assert (row.status, row.target) == ("implemented-as", "student.data_args.keep_split")
    config = load_config(path)
    args = config.student.data_args
    assert args is not None and args.keep_split == "train"
    tokenizer = load_tokenizer(
        config.student.model_args.model_copy(update={"model_name_or_path": resolve_model_uri("tiny://nano")})
    )
    splits = load_splits(args, "sft", tokenizer)
    texts = [tokenizer.decode(example["input_ids"]) for example in splits.train]
    assert [next(n for n in "34567" if f"汤姆有 {n} 个" in text) for text in texts] == ["3", "5", "7"]
    assert len(splits.eval) == 3
    assert splits.metrics["data/train/dropped/other_split"] == splits.metrics["data/eval/dropped/other_split"] == 2.0
