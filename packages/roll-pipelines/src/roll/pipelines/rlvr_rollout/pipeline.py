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
state: the data cursor, running totals and metrics) is written every ``save_steps`` batches;
``resume_from_checkpoint: auto`` cuts ``rollouts.jsonl`` back to the checkpoint and continues. At the end a summary is printed and written to
``summary.json``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.data import PromptCollator
from roll.pipelines.rewards import resolve_reward_worker
from roll.pipelines.rlvr.rollout import Rollouts, check_reward_fields, route_domain_column
from roll.pipelines.rlvr.workers import InferWorker
from roll.pipelines.rlvr_rollout.config import RLVRRolloutConfig
from roll.pipelines.rlvr_rollout.summary import RolloutTotals, format_summary, rollout_metrics
from roll.pipelines.rlvr_rollout.writer import ROLLOUTS_FILE, RolloutWriter
from roll.pipelines.stages import BatchStream, StepTimer, load_split
from roll.pipelines.tokenizers import load_tokenizer
from roll.protocol import DataProto

__all__ = ["SUMMARY_FILE", "RLVRRolloutPipeline"]

SUMMARY_FILE = "summary.json"


class RLVRRolloutPipeline(BasePipeline):
    """Generate and score, batch by batch; see the module docstring for outputs and resume."""

    config_cls = RLVRRolloutConfig
    config: RLVRRolloutConfig

    def setup(self) -> None:
        cfg = self.config
        role = cfg.actor_infer
        # 1. data: prompts (checked against what each reward domain needs) before anything starts
        data_args = role.require_data()
        data_args = data_args.model_copy(
            update={"max_prompt_length": data_args.max_prompt_length or cfg.rollout.prompt_length}
        )
        self.tokenizer = load_tokenizer(role.model_args)
        self.examples, report = load_split(data_args, "prompt", self.tokenizer, cfg.split)
        dropped = {i for indices in report.dropped_indices.values() for i in indices}
        # Row numbers in the loaded data, so rollouts can be joined back to the dataset after length filtering.
        self.prompt_index = [i for i in range(report.total) if i not in dropped]
        self.data_metrics = report.as_metrics(f"data/{cfg.split}")
        rewards = route_domain_column([self.examples], cfg.rewards)
        if rewards is not cfg.rewards:  # rows that name their domain: the reward routing sees their tags
            self.config = cfg = cfg.model_copy(update={"rewards": rewards})
        reward_workers = {domain: resolve_reward_worker(reward.reward_type) for domain, reward in cfg.rewards.items()}
        check_reward_fields(self.examples, cfg.rewards, reward_workers, data_field="actor_infer.data_args")
        collator = PromptCollator(self.tokenizer.pad_token_id, cfg.rollout.prompt_length)
        self.batches = BatchStream(
            self.examples,
            cfg.rollout.batch_size,
            collator,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
            drop_last=False,
        )
        # Without max_steps, every prompt is rolled out exactly once.
        self.max_steps = cfg.max_steps or self.batches.batches_per_epoch
        self.totals = RolloutTotals()
        # 2. session; 3. roles
        self.open_session()
        roles = {"actor_infer": Role(InferWorker, role)}
        for domain, reward in cfg.rewards.items():
            roles[f"reward/{domain}"] = Role(reward_workers[domain], reward)
        clusters = self.create_clusters(roles)
        # 4. wiring
        reward_clusters = {domain: clusters[f"reward/{domain}"] for domain in cfg.rewards}
        self.rollouts = Rollouts(clusters["actor_infer"], reward_clusters, cfg.rewards, self.tokenizer)
        self.rollouts_path = self.output_dir / ROLLOUTS_FILE

    # --- state ------------------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        return {"batches": self.batches.state_dict(), "totals": self.totals.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state["batches"])
        self.totals = RolloutTotals(state.get("totals"))

    # --- one batch --------------------------------------------------------------------------------------
    def _rows(self, step: int, batch: DataProto, picked: list[int], n: int) -> list[dict[str, Any]]:
        columns = batch.non_tensor_batch
        extra_keys = self.config.actor_infer.require_data().extra_keys
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

    def step(self, step: int, writer: RolloutWriter) -> dict[str, Any]:
        """Generate, score and write one batch; returns its metrics."""
        generation = self.config.actor_infer.generating_args
        n = generation.num_return_sequences
        timer = StepTimer()
        started = time.perf_counter()
        picked, prompts = self.batches.next_indexed()
        with timer.phase("generate"):
            batch = self.rollouts.generate(prompts, generation)
        with timer.phase("reward"):
            batch = self.rollouts.score(batch)
        writer.append(self._rows(step, batch, picked, n))
        self.totals.add(batch, n)
        elapsed = time.perf_counter() - started
        return {
            **rollout_metrics(batch, n),
            **timer.times,
            "time/step_s": elapsed,
            "throughput/samples_per_s": len(batch) / elapsed,
            "throughput/tokens_per_s": float(batch.batch["response_mask"].sum()) / elapsed,
        }

    def run(self) -> dict[str, Any]:
        """Roll out ``max_steps`` batches (resuming if asked); returns the summary (also in summary.json)."""
        start = self.resume()
        writer = RolloutWriter(self.rollouts_path, keep_until_step=start)
        try:
            if start == 0:
                self.log_metrics(0, self.data_metrics)
            for step in self.steps(start):
                self.log_metrics(step, self.step(step, writer))
                self.do_checkpoint(step, force=step == self.max_steps)
        finally:
            writer.close()
        summary = self.totals.summary(self.config.actor_infer.generating_args.num_return_sequences)
        tmp = self.output_dir / f".{SUMMARY_FILE}.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, self.output_dir / SUMMARY_FILE)
        print(format_summary(summary, self.rollouts_path), flush=True)
        return summary
