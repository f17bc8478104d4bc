"""Experiment tracking: ``metrics.jsonl`` always, plus optional console, TensorBoard, W&B, MLflow, trackio, SwanLab.

Each optional backend is an extra of roll-pipelines (``pip install 'roll-pipelines[wandb]'``, or ``[trackers]`` for
all); selecting one that is not installed raises MissingExtraError with that command. ``tracker_kwargs.<name>`` goes
to the backend's constructor (see each class).

``metrics.jsonl`` holds one JSON object per logged step (``{"step": N, ...metrics}``). On resume it is cut
back to the checkpoint's step, so a resumed run's file reads exactly like an uninterrupted one.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roll.runtime import ConfigError, MissingExtraError, Registry, import_extra

__all__ = [
    "TRACKERS",
    "JsonlTracker",
    "Tracker",
    "check_tracker_installed",
    "check_tracker_names",
    "format_metrics_line",
    "read_metrics",
    "set_aside_metrics",
]

logger = logging.getLogger(__name__)

TRACKERS: Registry[type] = Registry("tracker", entry_point_group="roll.trackers")


def _clean(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file; a last line cut short (a run killed while writing it) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number < len(lines):  # damage inside the file is not a crash's trace: say where
                raise ValueError(f"{path} line {number} is not a JSON row: {e}") from None
            logger.warning("%s: ignoring its last line, cut short (%s)", path, e)
    return rows


def set_aside_metrics(output_dir: Path) -> Path | None:
    """Rename a ``metrics.jsonl`` left in ``output_dir`` by an earlier run to ``metrics.jsonl.prev`` (``.prev2``,
    ... when earlier ones are there: none is overwritten), so that a run starting at step 0 there does not append its
    steps after the earlier run's."""
    path = output_dir / "metrics.jsonl"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    kept, number = path.with_name("metrics.jsonl.prev"), 1
    while kept.exists():
        number += 1
        kept = path.with_name(f"metrics.jsonl.prev{number}")
    os.replace(path, kept)
    logger.warning("%s held the metrics of an earlier run that left no checkpoint; moved to %s", path, kept.name)
    return kept


class JsonlTracker:
    def __init__(self, output_dir: Path, **_: Any) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def truncate_after(self, step: int) -> None:
        self._file.close()
        kept = [row for row in read_metrics(self.path) if row.get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        os.replace(tmp, self.path)
        self._file = self.path.open("a")

    def finish(self) -> None:
        self._file.close()


_HEADLINE = (
    "val/correct",
    # agentic: the env's own success (per-tag metrics such as val/<tag>/success sort before it otherwise)
    "val/success",
    "rollout/success",
    "val/format",
    "loss",
    "val/loss",
    "reward",
    "val/accuracy",
    "accuracy",
    "kl",
    "grad_norm",
    "lr",
)


def format_metrics_line(step: int, metrics: Mapping[str, Any], max_items: int = 8) -> str:
    """A compact one-line summary, headline metrics first."""
    keys = sorted(metrics, key=lambda k: (not any(k.endswith(h) for h in _HEADLINE), k))
    parts = []
    for key in keys[:max_items]:
        value = _clean(metrics[key])
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return f"step {step}: " + "  ".join(parts)


class ConsoleTracker:
    def __init__(self, output_dir: Path, stream: Any = None, **_: Any) -> None:
        self.stream = stream or sys.stderr

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from tqdm import tqdm

        tqdm.write(format_metrics_line(step, metrics), file=self.stream)

    def finish(self) -> None:
        pass


def _require(module: str, tracker: str) -> Any:
    """Import ``module`` for ``tracker``, or raise MissingExtraError with the pip command of its extra."""
    return import_extra(module, f"tracker {tracker!r}", "roll-pipelines", tracker)


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float | int]:
    """The numeric metrics (0-d tensors and numpy scalars unwrapped, bools as 0/1, NaN and inf kept as floats)."""
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float):
            out[key] = value
    return out


class TensorBoardTracker:
    """Scalars to ``<output_dir>/tensorboard`` (event files; ``tensorboard --logdir <output_dir>/tensorboard``)."""

    def __init__(self, output_dir: Path, **_: Any) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in ``<output_dir>/wandb``; tracker_kwargs go to ``wandb.init`` (``project``, ``mode: offline``, ...)."""

    def __init__(self, output_dir: Path, exp_name: str = "roll", config: dict | None = None, **kwargs: Any) -> None:
        wandb = _require("wandb", "wandb")
        self.run = wandb.init(**{"name": exp_name, "config": config, "dir": str(output_dir), **kwargs})

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


_MLFLOW_KEY = re.compile(r"[^\w\-./ ]")


class MlflowTracker:
    """An MLflow run, through ``MlflowClient`` (no process-wide MLflow state).

    tracker_kwargs: ``tracking_uri`` (default: ``$MLFLOW_TRACKING_URI``, else a SQLite store
    ``<output_dir>/mlflow.db`` with artifacts in ``<output_dir>/mlflow-artifacts``; ``mlflow ui --backend-store-uri
    sqlite:///<output_dir>/mlflow.db`` shows it), ``experiment`` (default: exp_name), ``tags``.
    """

    def __init__(
        self,
        output_dir: Path,
        exp_name: str = "roll",
        config: dict | None = None,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        _require("mlflow", "mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric, self._param = Metric, Param
        artifact_location = None
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            output_dir.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"
            artifact_location = (output_dir / "mlflow-artifacts").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        name = experiment or exp_name
        found = self.client.get_experiment_by_name(name)
        experiment_id = (
            found.experiment_id if found else self.client.create_experiment(name, artifact_location=artifact_location)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=exp_name, tags=tags).info.run_id
        if config:
            params = [self._param(k, str(v)[:250]) for k, v in _flatten(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(_MLFLOW_KEY.sub("_", k), float(v), now, step) for k, v in _scalars(metrics).items()]
        for i in range(0, len(batch), 1000):  # and at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    """A trackio run (local by default: trackio's own folder, ``$TRACKIO_DIR``; ``trackio show`` opens it).

    tracker_kwargs go to ``trackio.init`` (``project``, default exp_name; ``space_id``; ...).
    """

    def __init__(self, output_dir: Path, exp_name: str = "roll", config: dict | None = None, **kwargs: Any) -> None:
        trackio = _require("trackio", "trackio")
        self.run = trackio.init(**{"project": exp_name, "config": config, **kwargs})

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


class SwanlabTracker:
    """A SwanLab run with its files in ``<output_dir>/swanlog``; tracker_kwargs go to ``swanlab.init``
    (``project``, default exp_name; ``mode``: ``cloud``, ``offline`` or ``local``; ``workspace``; ...)."""

    def __init__(self, output_dir: Path, exp_name: str = "roll", config: dict | None = None, **kwargs: Any) -> None:
        swanlab = _require("swanlab", "swanlab")
        defaults = {"project": exp_name, "name": exp_name, "config": config, "log_dir": str(output_dir / "swanlog")}
        self.run = swanlab.init(**{**defaults, **kwargs})

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


for _name, _cls in {
    "console": ConsoleTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
    "swanlab": SwanlabTracker,
}.items():
    TRACKERS.register(_name, _cls)


# tracker -> the module its backend imports (the pip extra has the tracker's name).
TRACKER_MODULES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
    "swanlab": "swanlab",
}


def check_tracker_names(names: list[str]) -> None:
    """Raise ConfigError naming every entry of ``track_with`` that is no registered tracker (with the known names
    and the closest one)."""
    known = ["jsonl", *TRACKERS.names()]
    unknown = [name for name in names if name not in known]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(f"track_with: unknown tracker {', '.join(hints)}; known trackers: {', '.join(known)}")


def check_tracker_installed(name: str) -> None:
    """Raise MissingExtraError with the pip command if tracker ``name``'s package is not installed (no import)."""
    module = TRACKER_MODULES.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        raise MissingExtraError(f"tracker {name!r}", "roll-pipelines", name, cause=f"no module named {module!r}")


class Tracker:
    """Fans each step's metrics out to metrics.jsonl and the configured backends."""

    def __init__(
        self,
        output_dir: Path,
        backends: list[str],
        *,
        exp_name: str = "roll",
        config: dict[str, Any] | None = None,
        tracker_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.jsonl = JsonlTracker(output_dir)
        self.backends = []
        kwargs = tracker_kwargs or {}
        for name in backends:
            if name == "jsonl":
                continue
            backend_cls = TRACKERS.get(name)
            self.backends.append(backend_cls(output_dir, exp_name=exp_name, config=config, **kwargs.get(name, {})))

    @property
    def metrics_path(self) -> Path:
        return self.jsonl.path

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.jsonl.log(step, metrics)
        for backend in self.backends:
            backend.log(step, metrics)

    def truncate_after(self, step: int) -> None:
        self.jsonl.truncate_after(step)

    def finish(self) -> None:
        for backend in [self.jsonl, *self.backends]:
            backend.finish()
