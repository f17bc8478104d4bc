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
