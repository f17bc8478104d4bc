"""Metrics of one scored batch, running totals over a run (restored on resume), and the final summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll.pipelines.evaluation import grade_rollouts, share
from roll.pipelines.rlvr.validation import CORRECT
from roll.protocol import DataProto

__all__ = ["RolloutTotals", "format_summary", "rollout_metrics"]


def _passes(correct: torch.Tensor, n: int) -> torch.Tensor:
    """Per prompt: whether any of its ``n`` consecutive samples is correct."""
    return correct.view(-1, n).max(-1).values


def rollout_metrics(batch: DataProto, n: int) -> dict[str, float]:
    """Mean score, accuracy, pass@n (n > 1), lengths and truncation of one scored batch, overall and per tag."""
    scores = batch.batch["scores"].float()
    correct = (scores >= CORRECT).float()
    lengths = batch.batch["response_mask"].float().sum(-1)
    truncated = torch.tensor([reason == "length" for reason in batch.non_tensor_batch["finish_reason"]]).float()
    out = {
        "rollout/score": float(scores.mean()),
        "rollout/accuracy": float(correct.mean()),
        "rollout/response_length": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/truncated_frac": float(truncated.mean()),
        "rollout/prompts": float(len(batch) // n),
        "rollout/samples": float(len(batch)),
    }
    if n > 1:
        out[f"rollout/pass@{n}"] = float(_passes(correct, n).mean())
    answers_correct, formatted = grade_rollouts(batch)
    out["rollout/correct"] = share(answers_correct) or 0.0
    format_share = share(formatted)
    if format_share is not None:
        out["rollout/format"] = format_share
    tags = np.asarray(batch.non_tensor_batch["tag"], dtype=object)
    for tag in sorted(set(tags.tolist())):
        rows = torch.from_numpy(tags == tag)
        out[f"rollout/score/{tag}"] = float(scores[rows].mean())
        out[f"rollout/accuracy/{tag}"] = float(correct[rows].mean())
    return out


class RolloutTotals:
    """Running sums over the whole run (restored on resume) for the final summary."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.sums: dict[str, dict[str, float]] = {key: dict(value) for key, value in (state or {}).items()}

    def state_dict(self) -> dict[str, dict[str, float]]:
        return {key: dict(value) for key, value in self.sums.items()}

    def add(self, batch: DataProto, n: int) -> None:
        scores = batch.batch["scores"].float()
        correct = (scores >= CORRECT).float()
        lengths = batch.batch["response_mask"].float().sum(-1)
        truncated = torch.tensor([reason == "length" for reason in batch.non_tensor_batch["finish_reason"]]).float()
        passed = _passes(correct, n)
        tags = list(batch.non_tensor_batch["tag"])
        groups = {"all": list(range(len(batch)))}
        for i, tag in enumerate(tags):
            groups.setdefault(f"tag/{tag}", []).append(i)
        for key, rows in groups.items():
            index = torch.tensor(rows)
            prompt_rows = index[index % n == 0] // n  # a prompt's samples share its tag
            entry = self.sums.setdefault(key, {})
            for name, value in (
                ("samples", float(len(rows))),
                ("prompts", float(len(prompt_rows))),
                ("score", float(scores[index].sum())),
                ("correct", float(correct[index].sum())),
                ("passed", float(passed[prompt_rows].sum())),
                ("length", float(lengths[index].sum())),
                ("truncated", float(truncated[index].sum())),
            ):
                entry[name] = entry.get(name, 0.0) + value

    def summary(self, n: int) -> dict[str, Any]:
        def reduce(entry: dict[str, float]) -> dict[str, float]:
            samples, prompts = max(entry["samples"], 1.0), max(entry["prompts"], 1.0)
            out = {
                "prompts": int(entry["prompts"]),
                "samples": int(entry["samples"]),
                "score": entry["score"] / samples,
                "accuracy": entry["correct"] / samples,
                "response_length": entry["length"] / samples,
                "truncated_frac": entry["truncated"] / samples,
            }
            if n > 1:
                out[f"pass@{n}"] = entry["passed"] / prompts
            return out

        overall = reduce(self.sums["all"]) if "all" in self.sums else {"prompts": 0, "samples": 0}
        by_tag = {key[len("tag/") :]: reduce(value) for key, value in sorted(self.sums.items()) if key != "all"}
        return {**overall, "n": n, "by_tag": by_tag}


def format_summary(summary: dict[str, Any], path: Path) -> str:
    """A few human-readable lines for the end of a run."""
    n = summary["n"]
    lines = [f"rollouts: {summary['prompts']} prompts x {n} samples = {summary['samples']} scored responses"]
    if summary["samples"]:

        def line(stats: dict[str, Any]) -> str:
            parts = [f"score {stats['score']:.4f}", f"accuracy {stats['accuracy']:.4f}"]
            if f"pass@{n}" in stats:
                parts.append(f"pass@{n} {stats[f'pass@{n}']:.4f}")
            parts.append(f"response length {stats['response_length']:.1f} tokens")
            parts.append(f"truncated {100 * stats['truncated_frac']:.1f}%")
            return ", ".join(parts)

        lines.append(f"  all: {line(summary)}")
        lines += [f"  {tag}: {line(stats)}" for tag, stats in summary["by_tag"].items()]
    lines.append(f"  rows in {path}")
    return "\n".join(lines)
