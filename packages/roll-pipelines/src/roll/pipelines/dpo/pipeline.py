"""The DPO pipeline.

Per step: a batch of P preference pairs laid out as 2P rows (chosen, rejected, chosen, ...);
``reference.compute_sequence_log_probs`` scores them once; ``actor_train.train_step`` minimizes the DPO
(sigmoid, with label smoothing) or IPO loss. Validation reports held-out preference accuracy (implicit reward of
the chosen answer strictly above the rejected one; ties, e.g. every pair before training, are reported apart as
``ties``) and the reward margin; with ``validation.generation_rows``, also greedy answers of the policy graded for
correctness and format (``val/correct``, ``val/format``) and ``val/correct_change`` since the first validation.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch

from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.data import PreferenceCollator
from roll.pipelines.dpo.config import DPOConfig
from roll.pipelines.dpo.workers import DPOWorker, dpo_metrics
from roll.pipelines.evaluation import HeldOutAnswers
from roll.pipelines.stages import BatchStream, batched, is_eval_step, load_splits
from roll.pipelines.tokenizers import load_tokenizer
from roll.pipelines.workers import LogProbWorker

__all__ = ["DPOPipeline"]


class DPOPipeline(BasePipeline):
    config_cls = DPOConfig
    config: DPOConfig

    def setup(self) -> None:
        cfg = self.config
        data_args = cfg.actor_train.require_data()
        # 1. data: errors surface before anything starts
        self.tokenizer = load_tokenizer(cfg.actor_train.model_args)
        self.splits = load_splits(data_args, "preference", self.tokenizer)
        self.collator = PreferenceCollator(self.tokenizer.pad_token_id, cast(int, data_args.max_length))
        validation = cfg.validation
        self.held_out = HeldOutAnswers.build(
            self.splits.eval,
            self.tokenizer,
            rows=validation.generation_rows,
            max_new_tokens=validation.max_new_tokens,
            batch_size=validation.batch_size,
        )
        self.initial_correct: float | None = None
        # 2. session; 3. roles
        self.open_session()
        clusters = self.create_clusters(
            {
                "actor_train": Role(DPOWorker, cfg.actor_train, cfg.loss),
                "reference": Role(LogProbWorker, cfg.reference),
            }
        )
        self.actor_train, self.reference = clusters["actor_train"], clusters["reference"]
        # 4. wiring
        self.set_checkpoint_clusters(self.actor_train)
        args = cfg.actor_train.training_args
        rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.actor_train.dp_size
        self.batches = BatchStream(
            self.splits.train,
            rows_per_step // 2,
            self.collator,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
            drop_last=data_args.drop_last,
        )

    def data_state(self) -> dict[str, Any]:
        return {"train": self.batches.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state["train"])

    def validate(self) -> dict[str, float]:
        if not self.splits.eval:
            return {}
        policy, reference = [], []
        for batch in batched(self.splits.eval, self.config.validation.batch_size, self.collator):
            policy.append(self.actor_train.compute_sequence_log_probs(batch).batch["seq_log_prob"])
            reference.append(self.reference.compute_sequence_log_probs(batch).batch["seq_log_prob"])
        metrics = dpo_metrics(torch.cat(policy), torch.cat(reference), self.config.loss.beta, "val/")
        metrics.update(self.held_out(self.actor_train))
        if "val/correct" in metrics:
            if self.initial_correct is None:
                self.initial_correct = metrics["val/correct"]
            metrics["val/correct_change"] = metrics["val/correct"] - self.initial_correct
        return metrics

    def algorithm_state(self) -> dict[str, Any]:
        return {} if self.initial_correct is None else {"initial_correct": self.initial_correct}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.initial_correct = state.get("initial_correct")

    def step(self, step: int) -> dict[str, Any]:
        began = time.perf_counter()
        batch = next(self.batches)
        reference = self.reference.compute_sequence_log_probs(batch)
        batch.batch["ref_seq_log_prob"] = reference.batch["seq_log_prob"]
        result = self.actor_train.train_step(batch)
        metrics: dict[str, Any] = dict(result.meta_info["metrics"])
        metrics["time/step_s"] = time.perf_counter() - began
        if is_eval_step(step, self.config.eval_steps, self.max_steps):
            metrics.update(self.validate())
        return metrics

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start == 0:
            self.log_metrics(0, {**self.validate(), **self.splits.metrics})
        for step in self.steps(start):
            last = self.log_metrics(step, self.step(step))
            self.do_checkpoint(step, force=step == self.max_steps)
        if self.config.export_hf:
            self.export_hf(self.actor_train)
        return last
