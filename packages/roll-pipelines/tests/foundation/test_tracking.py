from __future__ import annotations

import math

import pytest

from roll.pipelines.metrics import reduce_metrics
from roll.pipelines.plots import write_plots
from roll.pipelines.tracking import Tracker, format_metrics_line, read_metrics
from roll.runtime import MissingExtraError


def test_metrics_jsonl_and_truncation_on_resume(tmp_path):
    tracker = Tracker(tmp_path, [])
    for step in range(1, 6):
        tracker.log(step, {"loss": 1.0 / step, "lr": 0.1})
    tracker.truncate_after(3)
    tracker.log(4, {"loss": 0.2, "lr": 0.1})
    tracker.finish()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["loss"] == 0.2


def test_reduce_metrics_tags_and_lists():
    reduced = reduce_metrics(
        {"loss": [1.0, 3.0], "len@max": [3, 9], "tok@sum": [1, 2], "name": "x", "nan": float("nan")}
    )
    assert reduced["loss"] == 2.0 and reduced["len"] == 9 and reduced["tok"] == 3
    assert "name" not in reduced and math.isnan(reduced["nan"])


def test_console_line_puts_headline_metrics_first():
    line = format_metrics_line(7, {"zeta": 1, "loss": 0.123456, "val/accuracy": 0.5})
    assert line.startswith("step 7: loss=0.1235") and "val/accuracy=0.5" in line


def test_missing_tracker_extra_names_the_pip_command(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(MissingExtraError, match=r"pip install 'roll-pipelines\[wandb\]'"):
        Tracker(tmp_path, ["wandb"])


def test_plots_are_written_per_group(tmp_path):
    tracker = Tracker(tmp_path, [])
    for step in range(1, 4):
        tracker.log(step, {"loss": 1.0 / step, "val/accuracy": step / 10, "kl": 0.01, "response_length": 5})
    tracker.finish()
    written = write_plots(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert sorted(p.name for p in written) == ["kl.png", "lengths.png", "loss.png", "reward.png"]
    assert all(p.stat().st_size > 1000 for p in written)
