"""Data references beyond json/jsonl/parquet: .arrow and .csv files, save_to_disk folders and hub dataset names (from
a local HF cache in offline mode; there is no network here)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll.pipelines.data import DataError, check_data_reference, load_rows

ROWS = [{"prompt": f"What is {i} + 1?", "response": str(i + 1)} for i in range(5)]
TEST_ROWS = [{"prompt": "What is 9 + 9?", "response": "18"}]


def test_arrow_ipc_files_in_both_formats(tmp_path: Path) -> None:
    table = pa.Table.from_pylist(ROWS)
    stream, file = tmp_path / "stream.arrow", tmp_path / "file.arrow"
    with pa.ipc.new_stream(str(stream), table.schema) as writer:
        writer.write_table(table)
    with pa.ipc.new_file(str(file), table.schema) as writer:
        writer.write_table(table)
    assert load_rows(stream, required={"prompt": str}) == ROWS
    assert load_rows([file, stream]) == ROWS + ROWS
    (tmp_path / "bad.arrow").write_text("not arrow")
    with pytest.raises(DataError, match=r"bad.arrow.*not an Arrow IPC file"):
        load_rows(tmp_path / "bad.arrow")


def test_csv_files_with_a_header_row(tmp_path: Path) -> None:
    # every value is a string, as csv holds no types; an Excel export's byte-order mark is not part of the first key
    path = tmp_path / "rows.csv"
    path.write_text("\ufeffprompt,response\n" + "".join(f'"{r["prompt"]}",{r["response"]}\n' for r in ROWS))
    assert load_rows(path, required={"prompt": str, "response": str}) == ROWS
    (tmp_path / "missing.csv").write_text("prompt,answer\nWhat is 1 + 1?,2\n")
    with pytest.raises(DataError, match=r"missing.csv row 0: missing key 'response' \(keys: prompt, answer\)"):
        load_rows(tmp_path / "missing.csv", required={"prompt": str, "response": str})
    (tmp_path / "latin1.csv").write_bytes("prompt\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.csv: not a readable UTF-8 CSV file \(.*\); fix or re-export it"):
        load_rows(tmp_path / "latin1.csv")


def test_a_plain_directory_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match=r"is a directory but no save_to_disk folder"):
        load_rows(tmp_path / "folder")


def test_a_missing_local_file_is_not_sent_to_a_hub(tmp_path: Path, hub_cache) -> None:
    with pytest.raises(DataError, match=r"'data/train.jsonl', which does not exist"):
        load_rows("data/train.jsonl")


@pytest.mark.extra("datasets")
def test_save_to_disk_folders(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(TEST_ROWS)}
    ).save_to_disk(str(tmp_path / "dict"))
    assert load_rows(tmp_path / "one", required={"prompt": str, "response": str}) == ROWS
    assert load_rows(tmp_path / "dict", split="train") == ROWS
    assert load_rows(tmp_path / "dict", split="eval") == TEST_ROWS  # eval picks test (or validation)
    assert check_data_reference(str(tmp_path / "dict"), "data_args.file_name") is None


@pytest.fixture
def hub_dataset(tmp_path: Path, hub_cache, monkeypatch: pytest.MonkeyPatch) -> str:
    """``roll-test/arith`` in the offline hub cache: parquet train and test splits, as the hub's own layout."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS), repo / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(TEST_ROWS), repo / "data" / "test-00000-of-00001.parquet")
    (repo / "README.md").write_text("---\nlicense: apache-2.0\n---\n# arith\n")
    hub_cache("roll-test/arith", repo, repo_type="dataset")
    return "roll-test/arith"


@pytest.mark.extra("datasets")
def test_hub_dataset_names_read_the_offline_cache(hub_dataset: str) -> None:
    pytest.importorskip("datasets")
    assert load_rows(hub_dataset, required={"prompt": str}) == ROWS
    assert load_rows(hub_dataset, split="eval") == TEST_ROWS
    assert load_rows(f"{hub_dataset}:test") == TEST_ROWS
    with pytest.raises(DataError, match=r"no split 'validation'; it has \['train', 'test'\]|no split 'validation'"):
        load_rows(f"{hub_dataset}:validation")
    assert check_data_reference(hub_dataset, "data_args.file_name") is None


@pytest.mark.extra("datasets")
def test_a_hub_dataset_missing_offline_names_id_and_cache(hub_cache) -> None:
    pytest.importorskip("datasets")
    with pytest.raises(DataError) as info:
        load_rows("roll-test/absent")
    message = str(info.value)
    assert "data_args.file_name lists 'roll-test/absent'" in message
    assert "dataset 'roll-test/absent' is not in the Hugging Face cache" in message
    assert str(hub_cache.cache) in message
    assert "--repo-type dataset" in message


def test_json_rows_still_report_their_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    with pytest.raises(DataError, match=r"x.jsonl row 1 \(line 2\): invalid JSON"):
        load_rows(path)
