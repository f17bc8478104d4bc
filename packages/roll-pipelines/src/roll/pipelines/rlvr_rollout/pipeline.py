"""Rollout-only RLVR: generate responses to a prompt set and score them, with no training.

For measuring a policy (accuracy, pass@k, lengths) on a dataset, producing scored samples for offline
analysis or distillation, or checking a reward setup before an RL run. One step::

    samples = actor_infer.generate(next prompt batch)       n = generating_args.num_return_sequences per prompt
    rewards[domain].compute_rewards(samples)                routed by each prompt's tag, as in RLVR
    append the batch's rows to <output_dir>/rollouts.jsonl; log the batch's metrics

Prompts come from ``actor_infer.data_args`` (``file_name``, or ``eval_file_name`` with ``split: eval``), with the
same columns as RLVR prompts (``prompt``, ``tag`` and ``extra_keys`` such as ``ground_truth``). Without
``max_steps`` every prompt is rolled out exactly once (the last batch may be smaller); with it, ``max_steps``
batches are drawn, continuing into new (reshuffled) epochs when needed.

``rollouts.jsonl`` has one row per sample: ``step``, ``prompt_index`` (the prompt's row in the loaded data),
``uid`` (shared by the samples of one prompt), ``sample`` (0..n-1), ``tag``, ``prompt``, ``response_text``,
``score``, ``reward_info``, ``finish_reason``, ``response_length`` (tokens) and every ``extra_keys`` column. Each
batch is appended with one write and fsync'd, so a crash keeps every completed batch. A checkpoint (no model
state: the data cursor, running totals and metrics) is written every ``save_steps`` batches; ``resume_from_checkpoint: auto``
cuts ``rollouts.jsonl`` back to the checkpoint and continues. At the end a summary is printed and written to
``summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from roll.pipelines.base import BasePipeline
from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.data import PromptCollator, StatefulBatchIterator, load_task_rows, prepare_examples
from roll.pipelines.rewards import resolve_reward_worker
from roll.pipelines.rlvr.config import RewardConfig
from roll.pipelines.rlvr.rollout import Rollouts, check_reward_fields
from roll.pipelines.rlvr.validation import CORRECT
from roll.pipelines.rlvr.workers import InferWorker
from roll.pipelines.tokenizers import load_tokenizer
from roll.protocol import DataProto

__all__ = ["ROLLOUT_FIELDS", "RLVRRolloutConfig", "RLVRRolloutPipeline", "read_rollouts", "rollout_metrics"]

logger = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"
SUMMARY_FILE = "summary.json"
ROLLOUT_FIELDS = (
    "step",
    "prompt_index",
    "uid",
    "sample",
    "tag",
    "prompt",
    "response_text",
    "score",
    "reward_info",
    "finish_reason",
    "response_length",
)


class RLVRRolloutConfig(BaseConfig):
    """Generation + rewards only. Roles: ``actor_infer`` (with the prompts in its ``data_args``) and ``rewards``."""

    pipeline_cls: str = "rlvr_rollout"
    actor_infer: RoleConfig = Field(
        description="The policy to roll out (e.g. vllm or hf_infer); data_args holds the prompts, generating_args "
        "the sampling (num_return_sequences n gives pass@n)."
    )
    rewards: dict[str, RewardConfig] = Field(description="Reward domains, as in rlvr: {math: {reward_type: math}}.")
    split: Literal["train", "eval"] = Field(
        default="train", description="Roll out data_args.file_name ('train') or data_args.eval_file_name ('eval')."
    )
    rollout_batch_size: int = Field(default=64, ge=1, description="Prompts per batch (step); each gets n samples.")
    prompt_length: int = Field(default=256, ge=1, description="Longest prompt in tokens (longer prompts are dropped).")
    response_length: int | None = Field(
        default=None, ge=1, description="max_new_tokens of the rollouts (default: generating_args.max_new_tokens)."
    )
    max_steps: int | None = Field(  # type: ignore[assignment]
        default=None, ge=1, description="Batches to roll out; null: every prompt exactly once."
    )
    save_steps: int = Field(
        default=1, ge=0, description="Checkpoint every N steps (data cursor, totals and metrics; no model state)."
    )
    export_hf: bool = Field(default=False, description="Unused: nothing is trained.")

    @model_validator(mode="after")
    def _check_rollout(self) -> RLVRRolloutConfig:
        data = self.actor_infer.data_args
        if data is None:
            raise ValueError("actor_infer.data_args is required: file_name with the prompts to roll out")
        if self.split == "eval" and not data.eval_file_name:
            raise ValueError("split=eval rolls out actor_infer.data_args.eval_file_name, which is not set")
        if not self.rewards:
            raise ValueError("rewards needs at least one domain, e.g. rewards: {math: {reward_type: math}}")
        for domain, reward in self.rewards.items():
            if not reward.tag_included:
                object.__setattr__(reward, "tag_included", [domain])
        generation = self.actor_infer.generating_args
        if self.response_length is None:
            object.__setattr__(self, "response_length", generation.max_new_tokens)
        elif "max_new_tokens" in generation.model_fields_set and generation.max_new_tokens != self.response_length:
            raise ValueError(
                f"response_length={self.response_length} contradicts actor_infer.generating_args.max_new_tokens="
                f"{generation.max_new_tokens}; set only one of them"
            )
        object.__setattr__(generation, "max_new_tokens", self.response_length)
        clashes = sorted(set(data.extra_keys) & set(ROLLOUT_FIELDS))
        if clashes:
            raise ValueError(f"data_args.extra_keys {clashes} clash with rollouts.jsonl fields; rename those columns")
        return self


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray | torch.Tensor):
        return value.tolist()
    return str(value)


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a rollouts.jsonl file; a last line cut short by a crash is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # an interrupted final write, not corruption
                logger.warning("%s: ignoring an incomplete last line", path)
                continue
            raise
    return rows


class _RolloutWriter:
    """Appends whole batches to a jsonl file: one ``write`` per batch on an O_APPEND descriptor, then fsync."""

    def __init__(self, path: Path, keep_until_step: int) -> None:
        self.path = path
        if keep_until_step > 0:
            kept = [row for row in read_rollouts(path) if row.get("step", 0) <= keep_until_step]
            self._replace("".join(json.dumps(row) + "\n" for row in kept))
        else:
            self._replace("")  # a fresh run: drop what an earlier, uncheckpointed run left here
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _replace(self, text: str) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        data = "".join(json.dumps(row, default=_jsonable) + "\n" for row in rows).encode()
        view = memoryview(data)
        while view:  # a short write (e.g. interrupted by a signal) continues where it stopped
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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
    tags = np.asarray(batch.non_tensor_batch["tag"], dtype=object)
    for tag in sorted(set(tags.tolist())):
        rows = torch.from_numpy(tags == tag)
        out[f"rollout/score/{tag}"] = float(scores[rows].mean())
        out[f"rollout/accuracy/{tag}"] = float(correct[rows].mean())
    return out


class _Totals:
    """Running sums over the whole run (restored on resume) for the final summary."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.sums: dict[str, dict[str, float]] = {key: dict(value) for key, value in (state or {}).items()}

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


class RLVRRolloutPipeline(BasePipeline):
    """Generate and score, batch by batch; see the module docstring for outputs and resume."""

    config_cls = RLVRRolloutConfig
    config: RLVRRolloutConfig

    def prepare_data(self) -> None:
        cfg = self.config
        role = cfg.actor_infer
        data_args = role.data_args
        self.tokenizer = load_tokenizer(role.model_args)
        args = data_args.model_copy(update={"max_prompt_length": data_args.max_prompt_length or cfg.prompt_length})
        rows = load_task_rows(args, "prompt", split=cfg.split)
        self.examples, report = prepare_examples(rows, "prompt", self.tokenizer, args, name=cfg.split)
        dropped = {i for indices in report.dropped_indices.values() for i in indices}
        # Row numbers in the loaded data, so rollouts can be joined back to the dataset after length filtering.
        self.prompt_index = [i for i in range(len(rows)) if i not in dropped]
        self.data_metrics = report.as_metrics(f"data/{cfg.split}")
        workers = {domain: resolve_reward_worker(reward.reward_type) for domain, reward in cfg.rewards.items()}
        check_reward_fields(self.examples, cfg.rewards, workers, data_field="actor_infer.data_args")
        self.collator = PromptCollator(self.tokenizer.pad_token_id, cfg.prompt_length)
        self.batches = StatefulBatchIterator(
            len(self.examples),
            cfg.rollout_batch_size,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
            drop_last=False,
        )
        if cfg.max_steps is None:
            object.__setattr__(cfg, "max_steps", self.batches.batches_per_epoch)
        self.totals = _Totals()

    def __init__(self, config: RLVRRolloutConfig) -> None:
        super().__init__(config)
        roles: dict[str, tuple[Any, Any]] = {"actor_infer": (InferWorker, config.actor_infer)}
        for domain, reward in config.rewards.items():
            roles[f"reward/{domain}"] = (resolve_reward_worker(reward.reward_type), reward)
        clusters = self.create_clusters_parallel(roles)
        self.actor_infer = clusters["actor_infer"]
        reward_clusters = {domain: clusters[f"reward/{domain}"] for domain in config.rewards}
        self.rollouts = Rollouts(self.actor_infer, reward_clusters, config.rewards, self.tokenizer)
        self.rollouts_path = self.output_dir / ROLLOUTS_FILE
        self.writer: _RolloutWriter | None = None

    # --- state ------------------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        return {"batches": self.batches.state_dict(), "totals": self.totals.sums}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state["batches"])
        self.totals = _Totals(state.get("totals"))

    # --- one batch --------------------------------------------------------------------------------------
    def _rows(self, step: int, batch: DataProto, picked: list[int], n: int) -> list[dict[str, Any]]:
        columns = batch.non_tensor_batch
        extra_keys = self.config.actor_infer.data_args.extra_keys
        lengths = batch.batch["response_mask"].sum(-1).tolist()
        scores = batch.batch["scores"].tolist()
        rows = []
        for i in range(len(batch)):
            # The generation layout puts a prompt's n samples in consecutive rows (roll.strategies.base).
            example = picked[i // n]
            row = {
                "step": step,
                "prompt_index": self.prompt_index[example],
                "uid": columns["uid"][i],
                "sample": i % n,
                "tag": columns["tag"][i],
                "prompt": columns["prompt"][i],
                "response_text": columns["response_text"][i],
                "score": scores[i],
                "reward_info": columns["reward_info"][i],
                "finish_reason": columns["finish_reason"][i],
                "response_length": int(lengths[i]),
            }
            row.update({key: columns[key][i] for key in extra_keys})
            rows.append(row)
        return rows

    def step(self, step: int) -> dict[str, Any]:
        """Generate, score and write one batch; returns its metrics."""
        generation = self.config.actor_infer.generating_args
        n = generation.num_return_sequences
        started = time.perf_counter()
        picked = next(self.batches)
        batch = self.rollouts.generate(self.collator([self.examples[i] for i in picked]), generation)
        generated = time.perf_counter()
        batch = self.rollouts.score(batch)
        scored = time.perf_counter()
        self.writer.append(self._rows(step, batch, picked, n))
        self.totals.add(batch, n)
        elapsed = time.perf_counter() - started
        return {
            **rollout_metrics(batch, n),
            "time/generate_s": generated - started,
            "time/reward_s": scored - generated,
            "time/step_s": elapsed,
            "throughput/samples_per_s": len(batch) / elapsed,
            "throughput/tokens_per_s": float(batch.batch["response_mask"].sum()) / elapsed,
        }

    def run(self) -> dict[str, Any]:
        """Roll out ``max_steps`` batches (resuming if asked); returns the summary (also in summary.json)."""
        start = self.resume()
        self.writer = _RolloutWriter(self.rollouts_path, keep_until_step=start)
        try:
            if start == 0:
                self.log_metrics(0, self.data_metrics)
            for step in self.steps(start):
                self.log_metrics(step, self.step(step))
                self.do_checkpoint(step, force=step == self.config.max_steps)
        finally:
            self.writer.close()
        summary = self.totals.summary(self.config.actor_infer.generating_args.num_return_sequences)
        tmp = self.output_dir / f".{SUMMARY_FILE}.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, self.output_dir / SUMMARY_FILE)
        print(format_summary(summary, self.rollouts_path), flush=True)
        return summary
