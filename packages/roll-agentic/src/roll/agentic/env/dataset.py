"""The questions of a dataset env (``roll_math``, ``roll_qa``, ``roll_code``): read once per process, checked, and
picked by seed.

``dataset_name`` is one of:

* a local ``.jsonl``, ``.json``, ``.parquet``, ``.arrow`` or ``.csv`` file;
* a local folder: a ``save_to_disk`` folder (``split`` picks a DatasetDict's split), or, as in ROLL, a folder of
  data files of one type, read in name order;
* a Hugging Face dataset id (``namespace/name``), loaded with ``datasets`` (``split`` picks its split; see
  :mod:`roll.pipelines.data.sources` for the cache and ``HF_HUB_OFFLINE``).

Every row must hold the env's keys (``question_key`` and the answer or test key): a row without one is a
:class:`~roll.pipelines.data.DataError` naming the file, the 0-based row and the key, never skipped. The rows are kept
in a per-process cache, so the envs of one worker share one copy.

A seed picks row ``seed % len(rows)``: equal seeds give equal questions on any worker, the hashed seeds of training
draw rows uniformly, and validation (which gives these envs the seeds 0, 1, 2, ... per tag, see
:attr:`roll.agentic.env.base.Env.seed_is_index`) walks the rows in order.

:func:`longest_rows` finds the rows whose questions are longest in tokens, for the load-time check of
``rollout.sequence_length`` (:mod:`roll.agentic.pipeline.lengths`), which renders their first prompts; it checks so
any env class with a classmethod ``longest_questions(tokenizer, **env_config) -> LongestRows`` (as the dataset envs
have), the seed that plays a row being its index.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from roll.pipelines.data import DataError, validate_rows
from roll.pipelines.data.loading import default_cache_dir
from roll.pipelines.data.sources import (
    FILE_SUFFIXES,
    check_data_reference,
    is_saved_dataset,
    read_saved_dataset,
    read_source,
)
from roll.runtime import ConfigError

__all__ = ["COUNTED_CHARS", "LongestRows", "check_dataset", "load_questions", "longest_rows", "row_for_seed"]

_CACHE: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
_CHECKED: set[tuple[str, str | None, tuple[tuple[str, str], ...]]] = set()
_LOCK = threading.Lock()

COUNTED_CHARS = 500_000
"""Up to this many characters of questions in all, :func:`longest_rows` tokenizes every question in one batch call
(0.3-0.6 s with a byte-level BPE on a loaded 2-core machine); a larger dataset has only its :data:`CANDIDATE_ROWS`
longest questions by characters tokenized (0.2-0.3 s for 10k questions of 600 characters, once read)."""
CANDIDATE_ROWS = 512


def _read_file(path: Path, field: str) -> list[Any]:
    return read_source(path, field, "train", default_cache_dir())[0]


def _read_folder(path: Path, field: str) -> list[Any]:
    """ROLL's folder of data files: every file, in name order, all of one type."""
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    suffixes = {p.suffix.lower() for p in files}
    if not files or len(suffixes) > 1 or not suffixes <= set(FILE_SUFFIXES):
        raise DataError(
            f"{field}: the folder {str(path)!r} must hold data files of one type ({', '.join(FILE_SUFFIXES)}) or be "
            f"a save_to_disk folder; it has {sorted(p.name for p in files)[:8]}"
        )
    return [row for p in files for row in _read_file(p, field)]


def _read(dataset_name: str, split: str | None, field: str) -> list[Any]:
    path = Path(dataset_name).expanduser()
    if path.is_dir():
        if not is_saved_dataset(path):
            return _read_folder(path, field)
        return read_saved_dataset(path, field, "train", split)
    if path.is_file():
        if path.suffix.lower() not in FILE_SUFFIXES:
            raise DataError(f"{field}: unsupported file type {path.suffix!r} of {dataset_name!r}; use {FILE_SUFFIXES}")
        return _read_file(path, field)
    # a hub id (read_source names a missing local path); its split, if given, as read_source spells it
    name = f"{dataset_name}:{split}" if split is not None else dataset_name
    return read_source(name, field, "train", default_cache_dir())[0]


def load_questions(
    dataset_name: str, split: str | None, keys: Mapping[str, tuple[str, Any]], *, env: str
) -> list[dict[str, Any]]:
    """The rows of ``dataset_name`` (``split``), read once per process and shared, each checked to hold the columns
    of ``keys`` (env_config option -> (column, type or tuple of types, as
    :func:`roll.pipelines.data.validate_rows` takes them))."""
    if not isinstance(dataset_name, str) or not dataset_name.strip():
        raise ConfigError(f"{env} needs env_config.dataset_name: a local data file or folder, or a hub dataset id")
    field = f"{env} env_config.dataset_name"
    key = (dataset_name, split)
    required = {column: types for column, types in keys.values()}
    checked = (dataset_name, split, tuple(sorted((k, str(v)) for k, v in required.items())))
    with _LOCK:
        rows = _CACHE.get(key)
        if rows is None:
            rows = _read(dataset_name, split, field)
            _CACHE[key] = rows
        if checked not in _CHECKED:
            try:
                validate_rows(rows, dataset_name, required)
            except DataError as e:
                options = ", ".join(f"{option}={column!r}" for option, (column, _) in keys.items())
                raise DataError(f"{env}: {e}, or point env_config at the dataset's columns ({options})") from None
            _CHECKED.add(checked)
    return rows


def row_for_seed(rows: list[dict[str, Any]], seed: int | None) -> int:
    """The row a reset with ``seed`` plays: ``seed % len(rows)`` (a seed of None draws one at random)."""
    if seed is None:
        return random.randrange(len(rows))
    return int(seed) % len(rows)


def check_dataset(dataset_name: str, split: str | None, keys: Mapping[str, tuple[str, Any]], *, env: str) -> str:
    """``roll validate``: a local dataset is read and its rows checked; a hub id is looked up in the cache (a note
    when it is downloaded at run time). Raises DataError (DataNotFoundError for a local path that is not there)."""
    path = Path(str(dataset_name)).expanduser()
    if isinstance(dataset_name, str) and not path.exists():
        note = check_data_reference(dataset_name, f"{env} env_config.dataset_name")
        return note or f"{dataset_name} (hub dataset, in the cache)"
    rows = load_questions(dataset_name, split, keys, env=env)
    return f"{len(rows)} questions in {dataset_name}"


@dataclass(frozen=True)
class LongestRows:
    """The questions of a dataset by length in tokens, longest first (ties: the lower row first)."""

    dataset: str
    rows: int
    """How many rows the dataset has."""
    tokens: list[tuple[int, int]]
    """``(row, tokens of its question)`` of the rows counted, longest first."""
    every_row: bool
    """Whether every row was counted; otherwise only the :data:`CANDIDATE_ROWS` longest by characters were."""

    def rows_over(self, limit: int) -> int:
        """How many of the counted rows have questions over ``limit`` tokens (of every row, or a lower bound)."""
        return sum(1 for _, count in self.tokens if count > limit)


def longest_rows(rows: Sequence[Mapping[str, Any]], question_key: str, tokenizer: Any, *, dataset: str) -> LongestRows:
    """The rows of ``rows`` whose ``question_key`` is longest in ``tokenizer``'s tokens (no special tokens).

    Every question is tokenized in one batch call when they hold at most :data:`COUNTED_CHARS` characters in all;
    a larger dataset is ranked by characters first and only its :data:`CANDIDATE_ROWS` longest are tokenized (a row
    whose text takes unusually many tokens per character can then be missed: its first turn still checks it).
    """
    questions = [str(row[question_key]) for row in rows]
    chars = np.fromiter(map(len, questions), dtype=np.int64, count=len(questions))
    every_row = int(chars.sum()) <= COUNTED_CHARS or len(questions) <= CANDIDATE_ROWS
    picked = range(len(questions)) if every_row else np.argpartition(-chars, CANDIDATE_ROWS)[:CANDIDATE_ROWS].tolist()
    ids = tokenizer([questions[i] for i in picked], add_special_tokens=False)["input_ids"]
    tokens = sorted(zip(picked, map(len, ids), strict=True), key=lambda item: (-item[1], item[0]))
    return LongestRows(dataset, len(questions), [(int(row), count) for row, count in tokens], every_row)
