"""``rollouts.jsonl``: one row per scored sample, appended batch by batch so a crash keeps every finished batch."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["ROLLOUTS_FILE", "ROLLOUT_FIELDS", "RolloutWriter", "read_rollouts"]

logger = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"
# Every row's fields (the data's extra_keys columns come after them).
ROLLOUT_FIELDS = (
    "step",
    "prompt_index",
    "uid",
    "sample",
    "tag",
    "prompt",
    "response_text",
    "score",
    "reward_info",
    "finish_reason",
    "response_length",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray | torch.Tensor):
        return value.tolist()
    return str(value)


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a rollouts.jsonl file; a last line cut short by a crash is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # an interrupted final write, not corruption
                logger.warning("%s: ignoring an incomplete last line", path)
                continue
            raise
    return rows


class RolloutWriter:
    """Appends whole batches to a jsonl file: one ``write`` per batch on an O_APPEND descriptor, then fsync.

    Opening it keeps the rows of steps up to ``keep_until_step`` (those of the checkpoint a run resumes from) and
    drops the rest, so a resumed file has no duplicates; a fresh run (0) starts an empty file.
    """

    def __init__(self, path: Path, keep_until_step: int) -> None:
        self.path = path
        if keep_until_step > 0:
            kept = [row for row in read_rollouts(path) if row.get("step", 0) <= keep_until_step]
            self._replace("".join(json.dumps(row) + "\n" for row in kept))
        else:
            self._replace("")  # a fresh run: drop what an earlier, uncheckpointed run left here
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _replace(self, text: str) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        data = "".join(json.dumps(row, default=_jsonable) + "\n" for row in rows).encode()
        view = memoryview(data)
        while view:  # a short write (e.g. interrupted by a signal) continues where it stopped
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
