from __future__ import annotations

import math
import sys

import pytest

from roll.pipelines.metrics import reduce_metrics
from roll.pipelines.plots import write_plots
from roll.pipelines.tracking import Tracker, format_metrics_line, read_metrics
from roll.runtime import ConfigError, MissingExtraError


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


def test_a_last_row_cut_short_by_a_kill_is_dropped_on_resume(tmp_path):
    """A run killed while writing a row left half a line; resuming used to stop on a JSONDecodeError."""
    tracker = Tracker(tmp_path, [])
    for step in (1, 2):
        tracker.log(step, {"loss": 1.0})
    tracker.finish()
    with (tmp_path / "metrics.jsonl").open("a") as sink:
        sink.write('{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    resumed = Tracker(tmp_path, [])
    resumed.truncate_after(2)
    resumed.log(3, {"loss": 0.5})
    resumed.finish()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(ValueError, match="metrics.jsonl line 2 is not a JSON row"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_reduce_metrics_tags_and_lists():
    reduced = reduce_metrics(
        {"loss": [1.0, 3.0], "len@max": [3, 9], "tok@sum": [1, 2], "name": "x", "nan": float("nan")}
    )
    assert reduced["loss"] == 2.0 and reduced["len"] == 9 and reduced["tok"] == 3
    assert "name" not in reduced and math.isnan(reduced["nan"])


def test_console_line_puts_headline_metrics_first():
    line = format_metrics_line(7, {"zeta": 1, "loss": 0.123456, "val/accuracy": 0.5})
    assert line.startswith("step 7: loss=0.1235") and "val/accuracy=0.5" in line


def test_console_line_shows_agentic_success_before_per_tag_metrics():
    # An agentic step logs dozens of rollout/<Tag>/... and val/<Tag>/... metrics, which sort before the lowercase
    # overall ones: without a headline entry val/success and rollout/success never reached the console.
    metrics = {f"val/Color/m{i}": 0.0 for i in range(10)} | {f"rollout/Color/m{i}": 0.0 for i in range(10)}
    line = format_metrics_line(3, {**metrics, "val/success": 0.25, "rollout/success": 0.5, "val/format": 1.0})
    shown = line.removeprefix("step 3: ").split("  ")
    assert sorted(shown[:3]) == ["rollout/success=0.5", "val/format=1", "val/success=0.25"]


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow", "trackio", "swanlab"])
def test_missing_tracker_extra_names_the_pip_command(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError, as when not installed
    with pytest.raises(MissingExtraError, match=rf"tracker '{name}'.*pip install 'roll-pipelines\[{name}\]'"):
        Tracker(tmp_path, [name])
    assert not list(tmp_path.glob(name + "*"))


def test_unknown_tracker_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown tracker .nosuchtracker.; known names: .*swanlab"):
        Tracker(tmp_path, ["nosuchtracker"])


def test_plots_are_written_per_group(tmp_path):
    tracker = Tracker(tmp_path, [])
    for step in range(1, 4):
        tracker.log(step, {"loss": 1.0 / step, "val/accuracy": step / 10, "kl": 0.01, "response_length": 5})
    tracker.finish()
    written = write_plots(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert sorted(p.name for p in written) == ["kl.png", "lengths.png", "loss.png", "reward.png"]
    assert all(p.stat().st_size > 1000 for p in written)


@pytest.mark.parametrize("resume", [False, "auto"])
def test_a_run_from_step_0_sets_an_earlier_runs_metrics_aside(tmp_path, monkeypatch, caplog, resume):
    """A run killed before its first checkpoint, started again in the same output_dir (fresh, or with
    resume_from_checkpoint=auto finding nothing), used to append its steps after the killed run's: 1, 2, 1, 2, 3."""
    from roll.pipelines import base
    from roll.pipelines.config import BaseConfig

    monkeypatch.setattr(base, "init", lambda: None)  # no Ray: only the output folder matters here
    monkeypatch.setattr(base, "ResourceManager", lambda **_: None)
    monkeypatch.setattr(base, "stop_on_sigterm", lambda: None)  # the test process keeps its own SIGTERM handler
    earlier = Tracker(tmp_path, [])
    for step in (1, 2):
        earlier.log(step, {"loss": 1.0})
    earlier.finish()
    config = BaseConfig.model_validate(
        {"pipeline_cls": "sft", "output_dir": str(tmp_path), "resume_from_checkpoint": resume, "track_with": []}
    )
    with caplog.at_level("WARNING"):
        session = base.Session.open(config)
    session.tracker.log(1, {"loss": 0.5})
    session.tracker.finish()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl.prev")] == [1, 2]
    assert "moved to metrics.jsonl.prev" in caplog.text
    assert ("no complete checkpoint" in caplog.text) == (resume == "auto")
    # started a third time: the second run's rows go beside the first's, overwriting nothing
    base.Session.open(config).tracker.finish()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl.prev")] == [1, 2]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl.prev2")] == [1]
