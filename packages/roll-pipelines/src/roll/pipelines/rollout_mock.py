"""Rollout dump and replay (ROLL's ``rollout_mock``), shared by the RLVR and agentic pipelines.

``mode: dump`` writes each training step's rollout batch (generated and scored, before log-probs and advantages)
to ``{dump_dir}/train/step_{step:06d}.pkl``; ``mode: mock`` (ROLL's name; ``replay`` is accepted too) reads those
files instead of generating, so training can be debugged or regression-tested on fixed rollouts. As in ROLL
(``RolloutMockMixin``), replay is strict: a missing step is an error, never a fresh rollout.

A file holds a header (format, pipeline, step, rows) beside the pickled batch and the step's rollout metrics;
replay checks the header against the run, so a dump of another pipeline or step, or with another batch size, fails
with an error naming the step and the file. Files are written to a temporary name and renamed: a crash leaves the
previous state or the whole file, never a partial one.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from roll.protocol import DataProto
from roll.runtime import ConfigError, RollError, RollModel

__all__ = ["RolloutDump", "RolloutMock", "RolloutMockConfig", "RolloutMockError"]

logger = logging.getLogger(__name__)
FORMAT = "roll-rollout-mock/1"


class RolloutMockError(RollError):
    """A replayed rollout is missing, unreadable or does not fit the run."""

    exit_code = 2


class RolloutMockConfig(RollModel):
    """ROLL's ``rollout_mock: {enable, mode, dump_dir}``."""

    enable: bool = Field(default=False, description="Dump or replay the training rollouts.")
    mode: Literal["dump", "mock"] = Field(
        default="dump", description="dump: write each step's rollout batch; mock (or replay): read it instead."
    )
    dump_dir: str = Field(default="./rollout_mock_dumps", description="Folder of the dumps (train/step_N.pkl).")

    @field_validator("mode", mode="before")
    @classmethod
    def _replay_alias(cls, value: Any) -> Any:
        return "mock" if value == "replay" else value


@dataclass
class RolloutDump:
    """One step's dumped rollout: the batch (None when a step kept nothing) and its rollout metrics."""

    batch: DataProto | None
    metrics: dict[str, float] = field(default_factory=dict)


class RolloutMock:
    """Dump/replay of one scheduler's batches (``scope`` train or val) for ``pipeline``."""

    def __init__(self, config: RolloutMockConfig, pipeline: str, scope: str = "train") -> None:
        self.config, self.pipeline, self.scope = config, pipeline, scope
        self.folder = Path(config.dump_dir) / scope

    @property
    def dumping(self) -> bool:
        return self.config.enable and self.config.mode == "dump"

    @property
    def replaying(self) -> bool:
        return self.config.enable and self.config.mode == "mock"

    def path(self, step: int) -> Path:
        return self.folder / f"step_{step:06d}.pkl"

    def dump(self, step: int, batch: DataProto | None, metrics: dict[str, float] | None = None) -> Path:
        """Write step ``step``'s batch atomically (temporary file, fsync, rename)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        header = {"format": FORMAT, "pipeline": self.pipeline, "scope": self.scope, "step": step}
        header["rows"] = 0 if batch is None else len(batch)
        payload = {"header": header, "batch": batch, "metrics": dict(metrics or {})}
        target = self.path(step)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as sink:
                pickle.dump(payload, sink, protocol=pickle.HIGHEST_PROTOCOL)
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        logger.info("rollout_mock: dumped step %d (%d rows) to %s", step, header["rows"], target)
        return target

    def load(self, step: int, rows: int | None = None) -> RolloutDump:
        """Step ``step``'s dump; ``rows``: the batch size this run expects (checked when given)."""
        path = self.path(step)
        if not path.is_file():
            have = sorted(p.name for p in self.folder.glob("step_*.pkl")) if self.folder.is_dir() else []
            raise RolloutMockError(
                f"rollout_mock replay: step {step} has no dump at {path} (found {len(have)} dumps in {self.folder}"
                f"{': ' + ', '.join(have[:5]) + (' ...' if len(have) > 5 else '') if have else ''}); run with "
                f"rollout_mock.mode=dump for at least as many steps, or point dump_dir at that run's folder"
            )
        try:
            with path.open("rb") as source:
                payload = pickle.load(source)
        except Exception as e:  # truncated or foreign file
            raise RolloutMockError(f"rollout_mock replay: step {step}: {path} is not readable ({e})") from None
        header = payload.get("header") if isinstance(payload, dict) else None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise RolloutMockError(
                f"rollout_mock replay: step {step}: {path} is not a roll rollout dump (ROLL's own pickles hold ROLL "
                f"objects and cannot be read by roll; dump again with roll)"
            )
        expected = {"pipeline": self.pipeline, "scope": self.scope, "step": step}
        wrong = {k: header.get(k) for k, v in expected.items() if header.get(k) != v}
        if wrong:
            raise RolloutMockError(
                f"rollout_mock replay: step {step}: {path} was dumped by {wrong} but this run expects "
                f"{ {k: expected[k] for k in wrong} }"
            )
        if rows is not None and header["rows"] not in (0, rows):
            raise RolloutMockError(
                f"rollout_mock replay: step {step}: {path} holds {header['rows']} rows but this run's batch has "
                f"{rows}; replay with the dumping run's batch settings"
            )
        logger.info("rollout_mock: replaying step %d (%d rows) from %s", step, header["rows"], path)
        return RolloutDump(payload["batch"], payload.get("metrics", {}))


def check_replay_supported(config: RolloutMockConfig, *, asynchronous: bool) -> None:
    if config.enable and config.mode == "mock" and asynchronous:
        raise ConfigError(
            "rollout_mock.mode=mock (replay) feeds dumped batches instead of generating: turn asynchronous "
            "generation off (async_generation_ratio) for the replay run"
        )
