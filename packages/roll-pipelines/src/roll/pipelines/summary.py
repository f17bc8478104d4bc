"""The before/after table printed at the end of ``roll run``: what the run changed on held-out data.

It reads the run's ``metrics.jsonl``: the first and the last validation (``val/*``) rows are "before" and
"after". Rows shown, when the run reports them: the agentic pipelines' ``val/success`` (the environments' own
success), ``val/correct`` (answers right, any format), ``val/format``
(answers in the requested format), the verifier's reward ``val/score`` and its full-marks share
``val/accuracy``, pass@k, the SFT losses and the DPO preference accuracy, the diffusion pipelines' measures
(reward, held-out denoising loss, distances of samples to held-out images, distillation gaps); then the steps
and the minutes the steps took (``time/steps_total_s`` of the last row, which every pipeline loop logs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from roll.pipelines.tracking import read_metrics

__all__ = ["STEPS_TOTAL_KEY", "SUMMARY_METRICS", "before_after", "format_before_after", "summarize_run"]

# The cumulative wall seconds of a run's loop steps, in every row logged inside the loop (BasePipeline.log_metrics).
STEPS_TOTAL_KEY = "time/steps_total_s"

# Metric -> label, in table order.
SUMMARY_METRICS: dict[str, str] = {
    "val/success": "success (the environment's own: goal reached, task solved)",
    "val/correct": "correct (answer right, any format)",
    "val/format": "format (answer in the requested format)",
    "val/score": "reward (verifier score)",
    "val/accuracy": "accuracy (verifier full marks / preference)",
    "val/exact_match": "exact match (whole response)",
    "val/answer_loss": "loss on answer tokens",
    "val/loss": "loss on response tokens",
    "val/reward": "reward (image reward, held-out conditions)",
    "val/denoising_loss": "denoising loss on held-out images",
    "val/fd": "FD of samples to held-out images",
    "val/fd_ratio": "FD / the teacher's FD",
    "val/mmd": "MMD of samples to held-out images",
    "val/mse_to_teacher": "MSE to the teacher's outputs",
    "val/mse_ratio": "MSE to the teacher / at the start",
}


def before_after(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``{"before": row, "after": row, "steps": int, "step_minutes": float}`` from metrics rows.

    ``before``/``after`` are the first/last rows holding ``val/`` metrics ({} when there are none);
    ``step_minutes`` is the last ``time/steps_total_s`` (all loop steps, their validations and checkpoints
    included, whatever ``logging_steps`` left out of the rows); in files without it, the sum of ``time/step_s``.
    """
    evaluated = [row for row in rows if any(key.startswith("val/") for key in row)]
    steps = max((int(row.get("step", 0)) for row in rows), default=0)
    totals = [float(row[STEPS_TOTAL_KEY]) for row in rows if STEPS_TOTAL_KEY in row]
    step_s = totals[-1] if totals else sum(float(row.get("time/step_s", 0.0)) for row in rows)
    return {
        "before": evaluated[0] if evaluated else {},
        "after": evaluated[-1] if evaluated else {},
        "steps": steps,
        "step_minutes": step_s / 60,
    }


def _value(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"


def format_before_after(summary: dict[str, Any], *, wall_s: float | None = None, notes: Sequence[str] = ()) -> str:
    """A plain-text table: metric | before (step a) | after (step b) | change; then steps and minutes."""
    before, after = summary["before"], summary["after"]
    keys = [k for k in SUMMARY_METRICS if k in before or k in after]
    keys += sorted(k for k in after if k.startswith("val/pass@"))
    head = ("metric (held-out)", f"before (step {before.get('step', 0)})", f"after (step {after.get('step', 0)})")
    labels = {key: SUMMARY_METRICS.get(key, key[len("val/") :]) for key in keys}
    w = max([46, *map(len, labels.values())])  # the label column fits the longest label (the agentic success one)
    lines = [f"{head[0]:<{w}} {head[1]:>16} {head[2]:>16} {'change':>9}"]
    for key in keys:
        a, b = before.get(key), after.get(key)
        change = f"{b - a:+.3f}" if isinstance(a, int | float) and isinstance(b, int | float) else "-"
        lines.append(f"{labels[key]:<{w}} {_value(a):>16} {_value(b):>16} {change:>9}")
    lines.append(f"{'steps':<{w}} {summary['steps']:>16}")
    lines.append(f"{'minutes in steps (training + validation)':<{w}} {summary['step_minutes']:>16.1f}")
    if wall_s is not None:
        lines.append(f"{'minutes, whole command':<{w}} {wall_s / 60:>16.1f}")
    lines.extend(notes)
    return "\n".join(lines)


def summarize_run(output_dir: str | Path, *, wall_s: float | None = None, notes: Sequence[str] = ()) -> str:
    """The before/after table of the run in ``output_dir`` ("" when it logged no validation)."""
    summary = before_after(read_metrics(Path(output_dir) / "metrics.jsonl"))
    if not summary["before"]:
        return ""
    return format_before_after(summary, wall_s=wall_s, notes=notes)
