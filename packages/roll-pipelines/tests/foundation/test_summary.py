"""The before/after table printed at the end of `roll run`."""

from __future__ import annotations

import json
from pathlib import Path

from roll.pipelines.summary import before_after, format_before_after, summarize_run

ROWS = [
    {"step": 0, "val/correct": 0.25, "val/format": 0.95, "val/score": 0.24, "data/train/total": 10.0},
    {"step": 1, "time/step_s": 30.0, "actor/loss": 0.1},
    {"step": 2, "time/step_s": 30.0, "val/correct": 0.5, "val/format": 1.0, "val/score": 0.5, "val/pass@4": 0.75},
]


def test_before_after_takes_the_first_and_last_validation() -> None:
    summary = before_after(ROWS)
    assert summary["before"]["step"] == 0 and summary["after"]["step"] == 2
    assert summary["steps"] == 2 and summary["step_minutes"] == 1.0
    table = format_before_after(summary, wall_s=180, notes=["(a note)"])
    lines = table.splitlines()
    assert "before (step 0)" in lines[0] and "after (step 2)" in lines[0]
    correct = next(line for line in lines if line.startswith("correct"))
    assert correct.split()[-3:] == ["0.250", "0.500", "+0.250"]
    assert next(line for line in lines if line.startswith("format")).split()[-1] == "+0.050"
    assert any(line.startswith("pass@4") and line.split()[-3:] == ["-", "0.750", "-"] for line in lines)
    assert lines[-3].split()[-1] == "1.0" and lines[-2].split()[-1] == "3.0" and lines[-1] == "(a note)"


def test_summarize_run_reads_metrics_jsonl(tmp_path: Path) -> None:
    assert summarize_run(tmp_path) == ""  # no metrics: nothing to report
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert "correct (answer right, any format)" in summarize_run(tmp_path)


def test_step_minutes_come_from_the_running_total_whatever_logging_skips() -> None:
    """Rows logged every 10 steps: the last running total is the time of all 20 steps (summing the logged
    rows' own step times would count 2 of them); diffusion measures get before/after rows."""
    rows = [
        {"step": 0, "val/denoising_loss": 0.50, "val/fd": 4.0},
        {"step": 10, "time/train_s": 2.0, "time/steps_total_s": 60.0},
        {"step": 20, "time/train_s": 2.0, "time/steps_total_s": 150.0, "val/denoising_loss": 0.10, "val/fd": 1.0},
    ]
    summary = before_after(rows)
    assert summary["step_minutes"] == 2.5 and summary["steps"] == 20
    lines = format_before_after(summary).splitlines()
    loss = next(line for line in lines if line.startswith("denoising loss on held-out images"))
    assert loss.split()[-3:] == ["0.500", "0.100", "-0.400"]
    assert next(line for line in lines if line.startswith("FD of samples")).split()[-1] == "-3.000"
    assert lines[-1].split()[-1] == "2.5"
    # files written before the running total: the sum of time/step_s, as before
    assert before_after(ROWS)["step_minutes"] == 1.0


def test_pipeline_loop_logs_the_running_total_of_step_time(monkeypatch, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from roll.pipelines import base
    from roll.pipelines.config import BaseConfig

    clock = iter([100.0, 103.0, 110.0, 112.0, 118.0, 121.0, 125.0, 126.0, 130.0])
    monkeypatch.setattr(base, "_clock", lambda: next(clock))
    config = BaseConfig(pipeline_cls="sft", max_steps=3, logging_steps=2, output_dir=str(tmp_path))
    pipeline = base.BasePipeline(config)
    logged: list[tuple[int, dict]] = []
    pipeline._session = SimpleNamespace(tracker=SimpleNamespace(log=lambda step, row: logged.append((step, row))))
    assert "time/steps_total_s" not in pipeline.log_metrics(0, {"val/x": 1.0})  # before the loop: no step time
    for step in pipeline.steps(0):  # step k starts at clock a, logs at b, ends at c
        pipeline.log_metrics(step, {"train/loss": float(step)})
    totals = [row["step"] and row.get("time/steps_total_s") for row in pipeline.state.metrics_history]
    # step 1: 100 -> log 103 (3) -> end 110 (10); step 2: 112 -> 118 (10 + 6) -> 121; step 3: 125 -> 126 (19 + 1)
    assert totals == [0, 3.0, 16.0, 20.0]
    assert [step for step, _ in logged] == [0, 2, 3]
    assert pipeline._steps_done_s == 24.0  # step 3 ended at 130


def test_agentic_runs_show_the_environments_success_first() -> None:
    rows = [
        {"step": 0, "val/success": 0.148, "val/format": 0.961},
        {"step": 59, "val/success": 0.164, "val/format": 0.953},
    ]
    lines = format_before_after(before_after(rows)).splitlines()
    assert lines[1].startswith("success (the environment's own") and lines[1].split()[-3:] == [
        "0.148",
        "0.164",
        "+0.016",
    ]
    assert lines[2].startswith("format (answer in the requested format)")


def test_columns_line_up_under_a_label_longer_than_the_default_width() -> None:
    """The agentic success label is longer than the label column was: its numbers and every row below stood one
    column further right than the header's."""
    rows = [{"step": 0, "val/success": 0.25, "val/format": 0.5}, {"step": 3, "val/success": 0.75, "val/format": 1.0}]
    lines = format_before_after(before_after(rows), wall_s=60).splitlines()
    ends = {len(line) for line in lines[:3]}  # header, success, format: the change column ends in one place
    assert len(ends) == 1, lines
    assert len({len(line) for line in lines[3:]}) == 1, lines  # steps and minutes: under the "before" column
    assert len(lines[3]) == lines[0].index("before (step 0)") + len("before (step 0)"), lines
