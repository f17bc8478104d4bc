"""Loading and validation: every malformed input is a DataError naming the file, the 0-based row and the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll.pipelines.data import (
    ChatMessages,
    DataArgs,
    DataError,
    load_rows,
    load_task_rows,
    required_columns,
    validate_rows,
)
from roll.runtime.errors import ConfigError, RollError

SFT = {"prompt": str, "response": str}
SFT_FIELDS = {"prompt": "prompt_key", "response": "response_key"}


def good(i: int) -> dict[str, str]:
    return {"prompt": f"q{i}", "response": f"a{i}"}


def test_jsonl_rows_load_in_order_across_files(write_jsonl) -> None:
    a = write_jsonl("a.jsonl", [good(0), good(1)])
    b = write_jsonl("b.jsonl", [good(2)])
    assert load_rows([a, b], required=SFT) == [good(0), good(1), good(2)]


def test_missing_key_names_file_row_key_and_fix(write_jsonl) -> None:
    rows = [good(i) for i in range(17)] + [{"prompt": "q", "answer": "a"}]
    path = write_jsonl("train.jsonl", rows)
    with pytest.raises(DataError) as info:
        load_rows(str(path), required=SFT, fields=SFT_FIELDS)
    assert str(info.value) == (
        f"{path} row 17: missing key 'response' (keys: prompt, answer); set data_args.response_key or fix the row"
    )
    assert isinstance(info.value, RollError)


def test_wrong_type_names_row_key_and_types(write_jsonl) -> None:
    path = write_jsonl("train.jsonl", [good(0), good(1), {"prompt": 5, "response": "a"}])
    with pytest.raises(DataError, match=re.escape(f"{path} row 2: key 'prompt' is int ('5'), expected str")):
        load_rows(path, required=SFT)


def test_bool_is_not_an_int(write_jsonl) -> None:
    with pytest.raises(DataError, match=r"row 0: key 'n' is bool"):
        validate_rows([{"n": True}], "x.jsonl", {"n": int})


def test_null_value_is_reported_as_null() -> None:
    with pytest.raises(DataError, match=r"x.jsonl row 1: key 'response' is null"):
        validate_rows([good(0), {"prompt": "q", "response": None}], "x.jsonl", SFT)


def test_messages_must_be_a_list_of_role_content_dicts() -> None:
    spec = {"messages": ChatMessages}
    ok = {"messages": [{"role": "user", "content": "hi"}]}
    validate_rows([ok], "chat.jsonl", spec)
    with pytest.raises(DataError, match=r"chat.jsonl row 1: key 'messages' must be a list of messages, got dict"):
        validate_rows([ok, {"messages": '{"role": "user"}'}], "chat.jsonl", spec, fields={"messages": "messages_key"})
    with pytest.raises(
        DataError,
        match=r"chat.jsonl row 1: key 'messages' is a string that is not JSON \(Expecting value at column 1: 'hi'\); "
        r"it must be a list of messages, or such a list written as a JSON string; set data_args.messages_key",
    ):
        validate_rows([ok, {"messages": "hi"}], "chat.jsonl", spec, fields={"messages": "messages_key"})
    with pytest.raises(DataError, match=r"chat.jsonl row 0: key 'messages' message 1 has no 'content'"):
        validate_rows([{"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}], "chat.jsonl", spec)
    with pytest.raises(DataError, match=r"row 0: key 'messages' message 0 has a int 'role'"):
        validate_rows([{"messages": [{"role": 1, "content": "a"}]}], "chat.jsonl", spec)
    with pytest.raises(DataError, match=r"row 0: key 'messages' is an empty list"):
        validate_rows([{"messages": []}], "chat.jsonl", spec)


def test_messages_written_as_json_strings_load_as_rolls_loader_reads_them(write_jsonl) -> None:
    """ROLL's own data files (data/math_deepmath_deal.jsonl) store each row's ``messages`` as a JSON string, which
    ROLL's loader parses; roll refused every such row ("must be a list of messages, got str"), so ROLL's RLVR
    examples failed at their first row. The string is parsed in place: later readers see the list."""
    messages = [{"role": "system", "content": "Box it."}, {"role": "user", "content": "1 + 1?"}]
    path = write_jsonl("roll.jsonl", [{"messages": json.dumps(messages), "ground_truth": "2", "tag": "math"}])
    rows = load_rows(path, required={"messages": ChatMessages}, fields={"messages": "messages_key"})
    assert rows == [{"messages": messages, "ground_truth": "2", "tag": "math"}]
    args = DataArgs(file_name=[str(path)], messages_key="messages")
    assert load_task_rows(args, "prompt")[0]["messages"] == messages


def test_non_object_row(write_jsonl) -> None:
    path = write_jsonl("train.jsonl", [good(0), "[1, 2]"])
    with pytest.raises(DataError, match=r"train.jsonl row 1: expected an object with named columns, got list"):
        load_rows(path)


def test_bad_json_line_gives_row_and_line(write_jsonl) -> None:
    # A blank line is skipped, so the broken line is line 4 but row 2.
    path = write_jsonl("train.jsonl", [good(0), "", good(1), '{"prompt": "q", "response": }'])
    with pytest.raises(DataError, match=r"train.jsonl row 2 \(line 4\): invalid JSON \(Expecting value at column 29\)"):
        load_rows(path)


def test_empty_file_is_an_error(write_jsonl, tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty.jsonl has no rows"):
        load_rows(path)
    array = tmp_path / "empty.json"
    array.write_text("[]")
    with pytest.raises(DataError, match=r"empty.json has no rows"):
        load_rows(array)


def test_missing_file_names_path_and_config_field(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match=r"data_args.file_name lists '.*nope.jsonl', which does not exist"):
        load_rows(str(missing))
    with pytest.raises(DataError, match=r"data_args.eval_file_name lists"):
        load_rows(str(missing), split="eval")


def test_unsupported_suffix_and_directory(tmp_path: Path) -> None:
    text = tmp_path / "rows.txt"
    text.write_text("prompt,response\n")
    with pytest.raises(DataError, match=r"unsupported file type '.txt'; use one of .json, .jsonl, .parquet"):
        load_rows(text)
    with pytest.raises(DataError, match=r"which is a directory"):
        load_rows(tmp_path)


def test_json_array_and_json_lines_in_a_json_file(tmp_path: Path) -> None:
    array = tmp_path / "a.json"
    array.write_text(json.dumps([good(0), good(1)], indent=2))
    assert load_rows(array, required=SFT) == [good(0), good(1)]
    lines = tmp_path / "b.json"
    lines.write_text(json.dumps(good(3)) + "\n")
    assert load_rows(lines) == [good(3)]
    broken = tmp_path / "c.json"
    broken.write_text('[\n  {"prompt": "q",\n   "response" "a"}\n]')
    with pytest.raises(DataError, match=r"c.json line 3 column 15: invalid JSON"):
        load_rows(broken)
    obj = tmp_path / "d.json"
    obj.write_text('  {"data": []}')
    with pytest.raises(DataError, match=r"d.json row 0: missing key 'prompt' \(keys: data\)"):
        load_rows(obj, required=SFT)


def test_parquet_rows_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([good(0), {"prompt": "q1", "response": None}]), path)
    assert load_rows(path)[0] == good(0)
    with pytest.raises(DataError, match=r"train.parquet row 1: key 'response' is null"):
        load_rows(path, required=SFT)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"bad.parquet: not a readable parquet file"):
        load_rows(bad)


def test_no_files_is_an_error() -> None:
    with pytest.raises(DataError, match=r"lists no files"):
        load_rows([])


def test_data_args_accepts_roll_aliases_and_rejects_bad_values() -> None:
    args = DataArgs.model_validate({"file_name": ["a.jsonl"], "prompt": "question", "response": "answer", "tag": "d"})
    assert (args.prompt_key, args.response_key, args.tag_key) == ("question", "answer", "d")
    assert args.files("train") == ["a.jsonl"] and args.files("eval") == []
    with pytest.raises(ConfigError, match=r"extra_keys \['prompt'\] clash"):
        DataArgs(file_name="a.jsonl", extra_keys=["prompt"])
    with pytest.raises(ConfigError, match=r"max_prompt_length=512 leaves no room"):
        DataArgs(file_name="a.jsonl", max_length=512, max_prompt_length=512)
    with pytest.raises(ConfigError, match=r"no data files listed"):
        DataArgs(file_name=[])
    with pytest.raises(ConfigError, match=r"unknown field"):
        DataArgs(file_name="a.jsonl", promt_key="x")


def test_required_columns_follow_the_task_and_args() -> None:
    args = DataArgs(file_name="a.jsonl", extra_keys=["ground_truth"])
    assert required_columns(args, "sft")[0] == {"prompt": str, "response": str}
    assert required_columns(args, "preference")[0] == {"prompt": str, "chosen": str, "rejected": str}
    assert required_columns(args, "prompt")[0] == {"prompt": str, "tag": str, "ground_truth": object}
    chat = DataArgs(file_name="a.jsonl", messages_key="conv", default_tag="math")
    assert required_columns(chat, "prompt")[0] == {"conv": ChatMessages}


def test_load_task_rows_validates_with_the_configured_keys(write_jsonl) -> None:
    path = write_jsonl("rl.jsonl", [{"question": "q", "gt": "1"}, {"question": "q2"}])
    args = DataArgs(file_name=str(path), prompt_key="question", extra_keys=["gt"], default_tag="math")
    with pytest.raises(
        DataError, match=r"rl.jsonl row 1: missing key 'gt' \(keys: question\); set data_args.extra_keys"
    ):
        load_task_rows(args, "prompt")
    with pytest.raises(DataError, match=r"data_args.eval_file_name is not set"):
        load_task_rows(args, "prompt", split="eval")
