"""Load data references (files, save_to_disk folders, hub datasets, ``synthetic://``) into validated rows.

Rows are plain ``list[dict]``: every source is read (see :mod:`roll.pipelines.data.sources`) and validated here, so
a bad row is reported with its source, 0-based row, key and fix instead of surfacing later as an opaque tokenizer or
collator failure. json/jsonl are parsed here rather than by HF ``datasets``, whose json loader reports malformed lines
without the row; folders and hub names go through ``datasets``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from roll.pipelines.data.args import DataArgs, Task
from roll.pipelines.data.errors import DataError, describe_keys, row_location
from roll.pipelines.data.sources import read_source

__all__ = [
    "ChatMessages",
    "check_task_rows",
    "default_cache_dir",
    "load_rows",
    "load_task_rows",
    "required_columns",
    "validate_rows",
]

logger = logging.getLogger(__name__)

TypeSpec = type | tuple[type, ...]


class ChatMessages:
    """Marker type for ``validate_rows``: a non-empty list of ``{"role": str, "content": str}`` dicts, or that list
    written as a JSON string (ROLL's data files store their ``messages`` so, and ROLL's loader parses them), which
    ``validate_rows`` parses in place."""


def default_cache_dir() -> Path:
    """``$ROLL_DATA_CACHE``, else ``~/.cache/roll/data``: where ``synthetic://`` data is written."""
    return Path(os.environ.get("ROLL_DATA_CACHE", Path.home() / ".cache" / "roll" / "data"))


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _spec_name(spec: Any) -> str:
    if spec is ChatMessages:
        return "a list of {role, content} messages"
    if isinstance(spec, tuple):
        return " or ".join(t.__name__ for t in spec)
    return spec.__name__


def _fix_hint(key: str, fields: Mapping[str, str] | None) -> str:
    field = (fields or {}).get(key)
    return f"set data_args.{field} or fix the row" if field else "fix the row"


def _parse_messages(text: str, where: str, key: str, hint: str) -> Any:
    """A ``messages`` column written as a JSON string (ROLL's data files), parsed."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{where}: key {key!r} is a string that is not JSON ({e.msg} at column {e.colno}: {text[:40]!r}); it "
            f"must be a list of messages, or such a list written as a JSON string; {hint}"
        ) from None


def _check_messages(value: Any, where: str, key: str, hint: str) -> None:
    shape = "each message must be {'role': str, 'content': str}"
    if not isinstance(value, list):
        raise DataError(f"{where}: key {key!r} must be a list of messages, got {_type_name(value)}; {hint}")
    if not value:
        raise DataError(f"{where}: key {key!r} is an empty list of messages; {hint}")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise DataError(f"{where}: key {key!r} message {i} is a {_type_name(message)}; {shape}")
        for part in ("role", "content"):
            if not isinstance(message.get(part), str):
                problem = "has no" if part not in message else f"has a {_type_name(message[part])}"
                raise DataError(f"{where}: key {key!r} message {i} {problem} {part!r}; {shape}")


def _matches(value: Any, spec: TypeSpec) -> bool:
    if spec is object:
        return True
    types = spec if isinstance(spec, tuple) else (spec,)
    # bool is an int subclass, but a JSON true is never a valid count or id.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def validate_rows(
    rows: Sequence[Any],
    source: str,
    required: Mapping[str, Any],
    *,
    fields: Mapping[str, str] | None = None,
) -> None:
    """Check that every row is a dict with each ``required`` key of the required type.

    Args:
        rows: the rows of one file.
        source: the file name (or URI) used in error messages.
        required: key -> type, tuple of types, ``object`` (any value, even null) or :class:`ChatMessages` (a
            column of messages written as JSON strings is parsed in place: the rows then hold the lists).
        fields: key -> the ``DataArgs`` field that names that column, so the message can say what to set.

    Raises:
        DataError: naming ``source``, the 0-based row and the key, e.g. ``"train.jsonl row 17: missing key
            'response' (keys: prompt, answer); set data_args.response_key or fix the row"``.
    """
    if not rows:
        raise DataError(f"{source} has no rows; add data to it or remove it from the data files")
    for index, row in enumerate(rows):
        where = row_location(source, index)
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object with named columns, got {_type_name(row)}; fix the row")
        for key, spec in required.items():
            hint = _fix_hint(key, fields)
            if key not in row:
                raise DataError(f"{where}: missing key {key!r} (keys: {describe_keys(row)}); {hint}")
            value = row[key]
            if spec is ChatMessages:
                if isinstance(value, str):
                    value = row[key] = _parse_messages(value, where, key, hint)
                _check_messages(value, where, key, hint)
            elif not _matches(value, spec):
                raise DataError(
                    f"{where}: key {key!r} is {_type_name(value)} ({str(value)[:40]!r}), expected "
                    f"{_spec_name(spec)}; {hint}"
                )


def _read_json_lines(text: str, source: str) -> list[Any]:
    rows = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not rows
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(
                f"{source} row {len(rows)} (line {line_number}): invalid JSON ({e.msg} at column {e.colno}); "
                f"fix the line: each line of a jsonl file must be one JSON object"
            ) from None
    return rows


def _read_json_array(text: str, source: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{source} line {e.lineno} column {e.colno}: invalid JSON ({e.msg}); fix the file "
            f"(a .json file holds one array of objects, or one object per line)"
        ) from None
    if not isinstance(value, list):
        raise DataError(f"{source}: the top-level JSON value is {_type_name(value)}; it must be an array of objects")
    return value


def read_json_rows(path: Path, source: str) -> list[Any]:
    """The rows of a .json (an array of objects, or JSON lines) or .jsonl file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{source}: not UTF-8 text (byte {e.start}); re-encode the file as UTF-8") from None
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        return _read_json_array(text, source)
    return _read_json_lines(text, source)


def load_rows(
    paths: str | Path | Sequence[str | Path],
    *,
    split: str = "train",
    required: Mapping[str, Any] | None = None,
    fields: Mapping[str, str] | None = None,
    cache_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Read and concatenate the rows of data references (json / jsonl / parquet / arrow / csv files, save_to_disk
    folders, hub dataset names, ``synthetic://`` URIs).

    A ``.json`` file may hold one array of objects or JSON lines. Each file is validated on its own (see
    :func:`validate_rows`; an empty file is always an error) so messages name the file and its own row numbers.
    ``split`` ("train" or "eval") only picks the config field named in messages and the default split of
    synthetic URIs that do not give one.
    """
    names = [paths] if isinstance(paths, str | Path) else list(paths)
    field = "data_args.file_name" if split == "train" else "data_args.eval_file_name"
    if not names:
        raise DataError(f"{field} lists no files; give at least one path or synthetic:// URI")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    rows: list[dict[str, Any]] = []
    for name in names:
        file_rows, source = read_source(name, field, split, cache)
        validate_rows(file_rows, source, required or {}, fields=fields)
        logger.info("loaded %d rows from %s", len(file_rows), source)
        rows.extend(file_rows)
    return rows


def required_columns(args: DataArgs, task: Task) -> tuple[dict[str, Any], dict[str, str]]:
    """The columns ``task`` needs under ``args`` (for :func:`validate_rows`) and the field naming each."""
    required: dict[str, Any] = {}
    fields: dict[str, str] = {}

    def need(key: str, spec: Any, field: str | None) -> None:
        required[key] = spec
        if field is not None:
            fields[key] = field

    if args.messages_key is not None:
        need(args.messages_key, ChatMessages, "messages_key")
    else:
        need(args.prompt_key, str, "prompt_key")
        if args.query_key is not None:
            need(args.query_key, (str, type(None)), "query_key")
        if args.system_key is not None:
            need(args.system_key, (str, type(None)), "system_key")
        if task == "sft":
            need(args.response_key, str, "response_key")
    if task == "preference":
        need(args.chosen_key, str, "chosen_key")
        need(args.rejected_key, str, "rejected_key")
    if task == "prompt":
        if args.default_tag is None:
            need(args.tag_key, str, "tag_key (or data_args.default_tag)")
        for key in args.extra_keys:
            need(key, object, "extra_keys")
    return required, fields


def check_task_rows(args: DataArgs, task: Task, where: str) -> str | None:
    """For ``roll validate``: every row of the local data files of ``args`` has the columns ``task`` needs (a
    missing one would otherwise stop the run at its start). A split with a file not on this machine (a hub name, an
    absent path: the reference check reports it) or ``synthetic://`` data is not read."""
    counted = []
    for split in ("train", "eval"):
        names = args.files(split)
        if names and all(Path(name).expanduser().is_file() for name in names):
            counted.append(f"{len(load_task_rows(args, task, split=split))} {split}")
    return f"{where}: rows checked for their columns ({', '.join(counted)})" if counted else None


def load_task_rows(args: DataArgs, task: Task, *, split: str = "train") -> list[dict[str, Any]]:
    """Load and validate the ``split`` files of ``args`` for ``task`` ("sft", "preference" or "prompt")."""
    names = args.files(split)
    if not names:
        raise DataError(f"{args.field_for(split)} is not set; give the {split} data files")
    required, fields = required_columns(args, task)
    return load_rows(names, split=split, required=required, fields=fields, cache_dir=args.cache_dir)
