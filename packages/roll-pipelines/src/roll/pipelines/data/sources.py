"""Where rows come from: local files, ``save_to_disk`` folders, hub datasets and ``synthetic://`` URIs.

A data reference (an entry of ``data_args.file_name`` / ``eval_file_name``) is one of:

* a local ``.json`` (an array of objects, or JSON lines), ``.jsonl`` or ``.parquet`` file, read here with row-precise
  errors, an ``.arrow`` file (Arrow IPC, as ``datasets`` writes them), read with pyarrow, or a ``.csv`` file with a
  header row (UTF-8, a byte-order mark allowed; every value is a string, an empty cell ``""``);
* a folder written by ``datasets``' ``save_to_disk`` (a Dataset, or a DatasetDict whose split is picked by the
  reference's split: ``train`` for file_name, ``test`` or else ``validation`` for eval_file_name);
* a hub dataset name, ``namespace/name`` or ``namespace/name:split``: its snapshot from the Hugging Face cache (see
  :mod:`roll.pipelines.hub`: ``HF_HUB_OFFLINE`` reads only the cache; ModelScope with ``USE_MODELSCOPE``), loaded
  with ``datasets.load_dataset``;
* ``synthetic://<generator>?...``: a generated jsonl file (see :mod:`roll.pipelines.data.synthetic`).

Folders and hub names need the ``datasets`` extra (``pip install 'roll-pipelines[datasets]'``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from roll.pipelines.data.errors import DataError
from roll.pipelines.hub import HubError, cached_hub_repo, is_hub_id, resolve_hub_repo, use_modelscope
from roll.runtime import import_extra

__all__ = [
    "FILE_SUFFIXES",
    "DataNotFoundError",
    "check_data_reference",
    "is_saved_dataset",
    "read_saved_dataset",
    "read_source",
]

FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".arrow", ".csv")
_EVAL_SPLITS = ("test", "validation", "eval")


class DataNotFoundError(DataError):
    """A data reference names a local file that does not exist (on this machine)."""


def _datasets() -> Any:
    return import_extra("datasets", "a datasets folder or hub dataset name", "roll-pipelines", "datasets")


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and (
        (path / "dataset_dict.json").is_file()
        or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())
    )


def _pick_split(splits: list[str], wanted: str | None, split: str, source: str) -> str:
    if wanted is not None:
        if wanted not in splits:
            raise DataError(f"{source}: no split {wanted!r}; it has {splits}")
        return wanted
    candidates = ("train",) if split == "train" else _EVAL_SPLITS
    for name in candidates:
        if name in splits:
            return name
    if len(splits) == 1:
        return splits[0]
    raise DataError(f"{source}: which split? it has {splits}; name one as '{source}:<split>'")


def _rows_of(dataset: Any) -> list[Any]:
    return list(dataset.to_list())


def read_saved_dataset(path: Path, source: str, split: str, wanted: str | None = None) -> list[Any]:
    """The rows of a ``save_to_disk`` folder; of a DatasetDict, split ``wanted``, else the one ``split`` (train or
    eval) picks."""
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises FileNotFoundError, ValueError, pyarrow errors...
        raise DataError(f"{source}: not a readable save_to_disk folder ({type(e).__name__}: {e})") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[_pick_split(list(loaded), wanted, split, source)]
    return _rows_of(loaded)


def _read_arrow(path: Path, source: str) -> list[Any]:
    import pyarrow as pa

    for opener in (pa.ipc.open_stream, pa.ipc.open_file):
        try:
            with opener(str(path)) as reader:
                return list(reader.read_all().to_pylist())
        except pa.ArrowInvalid:
            continue
    raise DataError(f"{source}: not an Arrow IPC file (stream or file format); regenerate or replace it")


def _read_csv(path: Path, source: str) -> list[Any]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            return [dict(row) for row in csv.DictReader(f)]
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{source}: not a readable UTF-8 CSV file ({e}); fix or re-export it") from None


def _split_hub_name(text: str) -> tuple[str, str | None]:
    name, sep, split = text.partition(":")
    return name, (split or None) if sep else None


def _read_hub(text: str, split: str) -> list[Any]:
    repo_id, wanted = _split_hub_name(text)
    folder = resolve_hub_repo(repo_id, repo_type="dataset")
    datasets = _datasets()
    try:
        loaded = datasets.load_dataset(str(folder))
    except Exception as e:  # datasets' builders raise many types
        raise DataError(f"hub dataset {repo_id!r} ({folder}) could not be loaded ({type(e).__name__}: {e})") from None
    return _rows_of(loaded[_pick_split(list(loaded), wanted, split, text)])


def read_file(path: Path, source: str) -> list[Any]:
    """The rows of a local data file (suffix in :data:`FILE_SUFFIXES`)."""
    from roll.pipelines.data.loading import read_json_rows

    suffix = path.suffix.lower()
    if suffix == ".arrow":
        return _read_arrow(path, source)
    if suffix == ".csv":
        return _read_csv(path, source)
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.read_table(path).to_pylist())
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{source}: not a readable parquet file ({e}); regenerate or replace it") from None
    return read_json_rows(path, source)


def _local(text: str, field: str) -> Path | None:
    """The local path ``text`` names, checked; None if it names none and is shaped as a hub dataset name."""
    path = Path(text).expanduser()
    if path.is_dir():
        if is_saved_dataset(path):
            return path
        raise DataError(
            f"{field} lists {text!r}, which is a directory but no save_to_disk folder (it has no dataset_dict.json "
            f"or state.json); list the data files inside it instead"
        )
    if path.exists():
        if path.suffix.lower() not in FILE_SUFFIXES:
            raise DataError(
                f"{field} lists {text!r}: unsupported file type {path.suffix or '(none)'!r}; "
                f"use one of {', '.join(FILE_SUFFIXES)}, a save_to_disk folder or a hub dataset name"
            )
        return path
    if is_hub_id(_split_hub_name(text)[0]) and path.suffix.lower() not in FILE_SUFFIXES:
        return None
    raise DataNotFoundError(
        f"{field} lists {text!r}, which does not exist (looked for {path.absolute()}); fix the path in {field}"
    )


def read_source(name: str | Path, field: str, split: str, cache_dir: Path) -> tuple[list[Any], str]:
    """The rows of data reference ``name`` and the name to show in messages (the reference as written)."""
    text = str(name)
    if text.startswith("synthetic://"):
        from roll.pipelines.data.synthetic import resolve_data_uri

        default_split = "train" if split == "train" else "eval"
        return read_file(resolve_data_uri(text, cache_dir, default_split=default_split), text), text
    path = _local(text, field)
    if path is None:
        try:
            return _read_hub(text, split), text
        except HubError as e:
            raise DataError(f"{field} lists {text!r}: no local file, and as a hub dataset: {e}") from e
    if path.is_dir():
        return read_saved_dataset(path, text, split), text
    return read_file(path, text), text


def check_data_reference(name: str, field: str) -> str | None:
    """Check that data reference ``name`` can be read, without reading it (hub names: in the cache when offline).

    Returns a note for references only fetched at run time, else None. Raises DataError / HubError otherwise.
    """
    if name.startswith("synthetic://"):
        return None
    path = _local(name, field)
    if path is not None:
        if path.is_dir():
            _datasets()
        return None
    _datasets()
    repo_id = _split_hub_name(name)[0]
    if use_modelscope():
        return f"{field}: {name} is fetched from ModelScope at run time"
    try:
        cached = cached_hub_repo(repo_id, repo_type="dataset")
    except HubError as e:
        raise DataError(f"{field} lists {name!r}: no local file, and as a hub dataset: {e}") from e
    return None if cached is not None else f"{field}: {name} is downloaded at run time"
