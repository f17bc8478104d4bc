"""Experiment tracking: ``metrics.jsonl`` always, plus optional console, TensorBoard, W&B, MLflow, trackio.

``metrics.jsonl`` holds one JSON object per logged step (``{"step": N, ...metrics}``). On resume it is cut
back to the checkpoint's step, so a resumed run's file reads exactly like an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roll.runtime import MissingExtraError, Registry

__all__ = ["TRACKERS", "JsonlTracker", "Tracker", "format_metrics_line", "read_metrics"]

TRACKERS: Registry[type] = Registry("tracker", entry_point_group="roll.trackers")


def _clean(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


class TensorBoardTracker:
    def __init__(self, output_dir: Path, **_: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise MissingExtraError("tracker 'tensorboard'", "roll-pipelines", "tensorboard", cause=str(e)) from e
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in metrics.items():
            value = _clean(value)
            if isinstance(value, int | float):
                self.writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, output_dir: Path, exp_name: str = "roll", config: dict | None = None, **kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as e:
            raise MissingExtraError("tracker 'wandb'", "roll-pipelines", "wandb", cause=str(e)) from e
        self.run = wandb.init(name=exp_name, config=config, dir=str(output_dir), **kwargs)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log({k: _clean(v) for k, v in metrics.items()}, step=step)

    def finish(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, output_dir: Path, exp_name: str = "roll", config: dict | None = None, **kwargs: Any) -> None:
        try:
            import mlflow
        except ImportError as e:
            raise MissingExtraError("tracker 'mlflow'", "roll-pipelines", "mlflow", cause=str(e)) from e
        self.mlflow = mlflow
        mlflow.set_experiment(kwargs.get("experiment", exp_name))
        self.run = mlflow.start_run(run_name=exp_name)
        if config:
            mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        numeric = {k.replace("@", "_"): _clean(v) for k, v in metrics.items() if isinstance(_clean(v), int | float)}
        self.mlflow.log_metrics(numeric, step=step)

    def finish(self) -> None:
        self.mlflow.end_run()


class TrackioTracker:
    def __init__(self, output_dir: Path, exp_name: str = "roll", config: dict | None = None, **kwargs: Any) -> None:
        try:
            import trackio
        except ImportError as e:
            raise MissingExtraError("tracker 'trackio'", "roll-pipelines", "trackio", cause=str(e)) from e
        self.trackio = trackio
        trackio.init(project=kwargs.get("project", exp_name), config=config)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.trackio.log({k: _clean(v) for k, v in metrics.items()}, step=step)

    def finish(self) -> None:
        self.trackio.finish()


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
}.items():
    TRACKERS.register(_name, _cls)


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
