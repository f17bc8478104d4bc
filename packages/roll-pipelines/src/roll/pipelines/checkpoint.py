"""Checkpoint folders: written under a temporary name, then renamed, so the last good one always survives.

Layout under ``<output_dir>/checkpoints``::

    step-00000010/              one complete checkpoint
        pipeline_state.json     step, data cursors, metrics history, algorithm state
        driver_rng.pkl          the driver's RNG states
        <role>/                 what each role's workers wrote (sharded model/optimizer/RNG)
        manifest.json           every other file with its size, written (fsynced) last before the rename
    .tmp-step-00000020/         a checkpoint being written (deleted at start-up if a crash left it)
    latest                      name of the newest complete checkpoint

A process killed at any moment (SIGKILL included) leaves either a temporary folder, deleted at the next start, or a
complete checkpoint: the folder is renamed only after every file and the manifest are on disk. A checkpoint whose
files do not match its manifest (a damaged disk, a copy cut short) is skipped by ``resume_from_checkpoint=auto``
with a warning, and is an error when named explicitly.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll.runtime import ConfigError

__all__ = ["CheckpointManager", "PipelineState", "capture_rng", "restore_rng", "verify_manifest", "write_manifest"]

logger = logging.getLogger(__name__)

_PREFIX = "step-"
_TMP_PREFIX = ".tmp-step-"
MANIFEST = "manifest.json"


@dataclass
class PipelineState:
    """Driver-side state that must survive a restart for the run to continue exactly."""

    step: int = 0
    data_state: dict[str, Any] = field(default_factory=dict)
    algorithm_state: dict[str, Any] = field(default_factory=dict)
    metrics_history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=float)

    @classmethod
    def from_json(cls, text: str) -> PipelineState:
        return cls(**json.loads(text))


def capture_rng() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["torch"])


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as sink:
        sink.write(data)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, path)


def _file_sizes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(folder: Path) -> None:
    """Record every file under ``folder`` with its size, after syncing them to disk."""
    sizes = _file_sizes(folder)
    for name in sizes:
        _fsync_path(folder / name)
    _atomic_write(folder / MANIFEST, json.dumps({"files": sizes}, indent=1).encode())


def verify_manifest(folder: Path) -> str | None:
    """None if ``folder`` holds exactly the files its manifest lists, with their sizes; else what is wrong."""
    manifest = folder / MANIFEST
    if not manifest.is_file():  # written before manifests existed: the atomic rename alone vouches for it
        return None
    expected = json.loads(manifest.read_text())["files"]
    found = _file_sizes(folder)
    missing = sorted(set(expected) - set(found))
    changed = sorted(k for k in expected if k in found and found[k] != expected[k])
    if missing or changed:
        return f"files missing {missing[:5]} or of the wrong size {changed[:5]}"
    return None


class CheckpointManager:
    """Creates, commits, finds and prunes checkpoint folders under ``root``."""

    def __init__(self, root: str | Path, max_to_keep: int = 2) -> None:
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    @staticmethod
    def name(step: int) -> str:
        return f"{_PREFIX}{step:08d}"

    def begin(self, step: int) -> Path:
        """A fresh temporary folder for checkpoint ``step``; workers write their parts into it."""
        tmp = self.root / f"{_TMP_PREFIX}{step:08d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, step: int, state: PipelineState) -> Path:
        """Write the pipeline state, make the checkpoint visible atomically, then prune old ones."""
        tmp = self.root / f"{_TMP_PREFIX}{step:08d}"
        _atomic_write(tmp / "pipeline_state.json", state.to_json().encode())
        _atomic_write(tmp / "driver_rng.pkl", pickle.dumps(capture_rng()))
        write_manifest(tmp)
        final = self.root / self.name(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_path(self.root)
        _atomic_write(self.root / "latest", final.name.encode())
        self._prune()
        return final

    def complete(self) -> list[Path]:
        """Committed checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX)]
        return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))

    def latest(self) -> Path | None:
        """The newest checkpoint that matches its manifest (damaged ones are skipped with a warning)."""
        for path in reversed(self.complete()):
            problem = verify_manifest(path)
            if problem is None:
                return path
            logger.warning("skipping checkpoint %s: %s", path, problem)
        return None

    def clean_incomplete(self) -> list[Path]:
        """Delete temporary folders a crash left behind; returns what was removed."""
        if not self.root.is_dir():
            return []
        leftovers = [p for p in self.root.iterdir() if p.name.startswith(_TMP_PREFIX)]
        for path in leftovers:
            # said aloud: a resumed run then starts from an earlier checkpoint, and the user should see why
            step = path.name[len(_TMP_PREFIX) :].lstrip("0") or "0"
            logger.warning("removing %s: checkpoint %s was cut short (the run stopped while saving it)", path, step)
            shutil.rmtree(path, ignore_errors=True)
        return leftovers

    def resolve(self, resume_from: bool | str) -> Path | None:
        """The checkpoint to resume from: None (fresh start), the latest one ('auto'), or an explicit folder."""
        if resume_from in (False, None, "", "false", "none"):
            return None
        if resume_from == "auto":
            return self.latest()
        path = Path(str(resume_from)).expanduser()
        problem = "no pipeline_state.json" if not (path / "pipeline_state.json").is_file() else verify_manifest(path)
        if problem is not None:
            raise ConfigError(
                f"resume_from_checkpoint={resume_from!r} is not a complete checkpoint ({problem}); "
                f"use 'auto' or one of {[str(p) for p in self.complete()] or 'the folders under ' + str(self.root)}"
            )
        return path

    @staticmethod
    def load_state(path: Path) -> PipelineState:
        state = PipelineState.from_json((path / "pipeline_state.json").read_text())
        rng_file = path / "driver_rng.pkl"
        if rng_file.is_file():
            restore_rng(pickle.loads(rng_file.read_bytes()))
        return state

    def _prune(self) -> None:
        done = self.complete()
        for old in done[: max(0, len(done) - self.max_to_keep)]:
            shutil.rmtree(old, ignore_errors=True)
