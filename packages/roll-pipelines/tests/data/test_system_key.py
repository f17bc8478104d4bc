"""ROLL's ``system_key``: a column with each row's system message (SFT, distill, prompts); null or empty: the
pipeline's ``system_prompt``, if any."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.data import DataArgs, DataError, encode_sft
from roll.pipelines.data.loading import load_task_rows

ALPACA = {"prompt_key": "instruction", "response_key": "output", "system_key": "system"}


def args(**overrides: Any) -> DataArgs:
    return DataArgs(**{"file_name": "train.jsonl", **ALPACA, **overrides})


def chatml(system: str | None, user: str, answer: str) -> str:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""
    return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>"


@pytest.mark.parametrize(
    ("system", "fallback", "rendered"),
    [
        ("You sort lists.", None, "You sort lists."),
        ("You sort lists.", "Be brief.", "You sort lists."),  # the row's own wins
        ("", "Be brief.", "Be brief."),  # ROLL adds no system message for an empty one; roll's system_prompt then
        (None, None, None),
    ],
)
def test_each_row_gets_its_own_system_message(tokenizer: Any, system, fallback, rendered) -> None:
    row = {"system": system, "instruction": "Sort [2, 1].", "output": "[1, 2]"}
    encoded = encode_sft(row, tokenizer, args(system_prompt=fallback))
    assert tokenizer.decode(encoded["input_ids"]) == chatml(rendered, "Sort [2, 1].", "[1, 2]")


def test_without_a_template_the_system_message_leads_the_prompt(tokenizer: Any) -> None:
    row = {"system": "S", "instruction": "Add 2 3.", "output": "5"}
    encoded = encode_sft(row, tokenizer, args(apply_chat_template=False))
    assert tokenizer.decode(encoded["input_ids"]).startswith("S\nAdd 2 3.")


def test_bad_system_values_name_the_row_and_the_field(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"row: system column 'system' must be a string, got int"):
        encode_sft({"system": 3, "instruction": "a", "output": "b"}, tokenizer, args())
    path = tmp_path / "train.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(r)
            for r in [{"system": "S", "instruction": "a", "output": "b"}, {"instruction": "a", "output": "b"}]
        )
    )
    with pytest.raises(DataError, match=r"train.jsonl.* row 1.*'system'.*system_key"):
        load_task_rows(args(file_name=str(path)), "sft")
    with pytest.raises(ValueError, match="system_key='system' and messages_key='messages' are both set"):
        DataArgs(file_name="x.jsonl", system_key="system", messages_key="messages")
