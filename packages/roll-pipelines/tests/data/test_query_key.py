"""ROLL's SFT ``query_key`` (Alpaca 'input'): appended to the prompt after a newline when non-empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.pipelines.data import IGNORE_INDEX, DataArgs, DataError, encode_sft, prepare_examples
from roll.pipelines.data.loading import load_task_rows

ALPACA = {"prompt_key": "instruction", "query_key": "input", "response_key": "output"}


def args(**overrides: Any) -> DataArgs:
    return DataArgs(**{"file_name": "train.jsonl", **ALPACA, **overrides})


def chatml(user: str, answer: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>"


def split(tokenizer: Any, encoded: dict[str, list[int]]) -> tuple[str, str]:
    ids, labels = encoded["input_ids"], encoded["labels"]
    first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    assert labels[first:] == ids[first:]
    return tokenizer.decode(ids[:first]), tokenizer.decode(ids[first:])


@pytest.mark.parametrize(
    ("query", "user"),
    [
        ("x = [3, 1, 2]", "Sort the list.\nx = [3, 1, 2]"),
        ("", "Sort the list."),  # ROLL: `prompt + ("\n" + query if query else "")`
        (None, "Sort the list."),  # a JSON null is no query either
    ],
)
def test_query_joins_the_prompt_after_a_newline(tokenizer: Any, query: str | None, user: str) -> None:
    row = {"instruction": "Sort the list.", "input": query, "output": "sorted(x)"}
    encoded = encode_sft(row, tokenizer, args())
    assert tokenizer.decode(encoded["input_ids"]) == chatml(user, "sorted(x)")
    # exact ids: the whole conversation tokenized at once by the tokenizer's own template
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": "sorted(x)"}]
    whole = tokenizer.apply_chat_template(messages, tokenize=False)
    assert encoded["input_ids"] == tokenizer.encode(whole, add_special_tokens=False)[: len(encoded["input_ids"])]
    prompt, target = split(tokenizer, encoded)
    assert prompt == f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    assert target == "sorted(x)<|im_end|>"


def test_query_without_chat_template(tokenizer: Any) -> None:
    row = {"instruction": "Add.", "input": "2 3", "output": "5"}
    encoded = encode_sft(row, tokenizer, args(apply_chat_template=False, system_prompt="S"))
    prompt, target = split(tokenizer, encoded)
    assert prompt == "S\nAdd.\n2 3"
    assert target == "5" + tokenizer.eos_token


def test_no_query_key_ignores_the_column(tokenizer: Any) -> None:
    row = {"instruction": "Sort the list.", "input": "x", "output": "y"}
    encoded = encode_sft(row, tokenizer, args(query_key=None))
    assert tokenizer.decode(encoded["input_ids"]) == chatml("Sort the list.", "y")


def test_missing_query_column_names_the_row(tokenizer: Any) -> None:
    with pytest.raises(DataError, match=r"train row 1: missing query column 'input' \(keys: instruction, output\)"):
        prepare_examples(
            [{"instruction": "a", "input": "", "output": "b"}, {"instruction": "a", "output": "b"}],
            "sft",
            tokenizer,
            args(),
            name="train",
        )


def test_loader_names_file_and_row_of_a_missing_or_bad_query(tmp_path: Path) -> None:
    path = tmp_path / "alpaca.jsonl"
    rows = [{"instruction": "a", "input": None, "output": "b"}, {"instruction": "a", "output": "b"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"alpaca.jsonl.*row 1.*missing key 'input'.*data_args.query_key"):
        load_task_rows(args(file_name=str(path)), "sft")
    path.write_text(json.dumps({"instruction": "a", "input": 3, "output": "b"}) + "\n")
    with pytest.raises(DataError, match=r"row 0.*'input' is int.*expected str or NoneType"):
        load_task_rows(args(file_name=str(path)), "sft")


def test_query_key_with_messages_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="query_key='input' and messages_key='conv' are both set"):
        args(messages_key="conv")
