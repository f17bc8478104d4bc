"""The DPO pipeline.

Per step: a batch of P preference pairs laid out as 2P rows (chosen, rejected, chosen, ...);
``reference.compute_sequence_log_probs`` scores them once; ``actor_train.train_step`` minimizes the DPO
(sigmoid, with label smoothing) or IPO loss. Validation reports held-out preference accuracy (implicit reward of
the chosen answer above the rejected one) and the reward margin.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from roll.pipelines.algorithms import dpo_loss
from roll.pipelines.base import BasePipeline
from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.data import PreferenceCollator, StatefulBatchIterator, load_task_rows, prepare_examples
from roll.pipelines.tokenizers import load_tokenizer
from roll.pipelines.workers import LogProbWorker
from roll.pipelines.workers.logprob import sequence_log_prob_forward
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.strategies import LossScale

__all__ = ["DPOConfig", "DPOPipeline", "DPOWorker", "dpo_metrics"]


class DPOConfig(BaseConfig):
    pipeline_cls: str = "dpo"
    actor_train: RoleConfig = Field(description="The policy being trained; its data_args hold the preference data.")
    reference: RoleConfig = Field(description="The frozen reference model (usually the same initial weights).")
    beta: float = Field(default=0.1, gt=0)
    label_smoothing: float = Field(default=0.0, ge=0, le=0.5)
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"
    val_batch_size: int = Field(default=32, ge=1, description="Pairs per validation batch.")

    @model_validator(mode="after")
    def _check_dpo(self) -> DPOConfig:
        data = self.actor_train.data_args
        if data is None or data.max_length is None:
            raise ValueError("actor_train.data_args with file_name and max_length is required")
        if self.actor_train.training_args.per_device_train_batch_size % 2:
            raise ValueError(
                "actor_train.training_args.per_device_train_batch_size counts sequences and must be even "
                "(a chosen/rejected pair stays in one micro-batch)"
            )
        self.fill_training_steps(self.actor_train)
        return self


def dpo_metrics(policy: torch.Tensor, reference: torch.Tensor, beta: float, prefix: str) -> dict[str, float]:
    """Accuracy and reward statistics of pairs laid out as rows (chosen, rejected, ...)."""
    chosen = beta * (policy[0::2] - reference[0::2])
    rejected = beta * (policy[1::2] - reference[1::2])
    margin = chosen - rejected
    # A tie (e.g. policy == reference before training) counts as half right, so an untrained policy scores 0.5.
    accuracy = (margin > 0).float() + 0.5 * (margin == 0).float()
    return {
        f"{prefix}accuracy": float(accuracy.mean()),
        f"{prefix}rewards/chosen": float(chosen.mean()),
        f"{prefix}rewards/rejected": float(rejected.mean()),
        f"{prefix}rewards/margin": float(margin.mean()),
    }


class DPOWorker(LogProbWorker):
    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto) -> DataProto:
        if len(batch) % 2:
            raise ConfigError(f"{self.worker_name} got {len(batch)} rows: DPO batches must hold whole pairs")
        cfg = self.settings
        forward = sequence_log_prob_forward()

        def loss_func(
            micro: DataProto, logits: torch.Tensor, scale: LossScale
        ) -> tuple[torch.Tensor, dict[str, float]]:
            policy = forward(micro, logits)["seq_log_prob"]
            reference = micro.batch["ref_seq_log_prob"]
            losses, _, _ = dpo_loss(
                policy[0::2],
                policy[1::2],
                reference[0::2],
                reference[1::2],
                beta=cfg.beta,
                label_smoothing=cfg.label_smoothing,
                loss_type=cfg.loss_type,
            )
            pairs = scale.num_seqs / 2
            stats = dpo_metrics(policy.detach(), reference, cfg.beta, "train/")
            return losses.sum() / pairs, stats

        metrics = self.train_strategy.train_step(batch, loss_func, loss_mask_key="loss_mask")
        return DataProto(meta_info={"metrics": metrics})


class DPOPipeline(BasePipeline):
    config_cls = DPOConfig
    config: DPOConfig

    def prepare_data(self) -> None:
        data_args = self.config.actor_train.data_args
        self.tokenizer = load_tokenizer(self.config.actor_train.model_args)
        rows = load_task_rows(data_args, "preference")
        self.train_pairs, report = prepare_examples(rows, "preference", self.tokenizer, data_args, name="train")
        self.data_metrics = report.as_metrics("data/train")
        self.val_pairs = []
        if data_args.eval_file_name:
            val_rows = load_task_rows(data_args, "preference", split="eval")
            self.val_pairs, val_report = prepare_examples(
                val_rows, "preference", self.tokenizer, data_args, name="eval"
            )
            self.data_metrics.update(val_report.as_metrics("data/eval"))
        self.collator = PreferenceCollator(self.tokenizer.pad_token_id, data_args.max_length)

    def __init__(self, config: DPOConfig) -> None:
        super().__init__(config)
        data_args = config.actor_train.data_args
        clusters = self.create_clusters_parallel(
            {"actor_train": (DPOWorker, config.actor_train), "reference": (LogProbWorker, config.reference)}
        )
        self.actor_train, self.reference = clusters["actor_train"], clusters["reference"]
        self.set_checkpoint_clusters(self.actor_train)
        args = config.actor_train.training_args
        dp = self.actor_train.dp_size
        rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * dp
        self.pairs_per_step = rows_per_step // 2
        self.batches = StatefulBatchIterator(
            len(self.train_pairs),
            self.pairs_per_step,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
            drop_last=data_args.drop_last,
        )

    def data_state(self) -> dict[str, Any]:
        return {"train": self.batches.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state["train"])

    def validate(self) -> dict[str, float]:
        if not self.val_pairs:
            return {}
        policy, reference = [], []
        size = self.config.val_batch_size
        for start in range(0, len(self.val_pairs), size):
            batch = self.collator(self.val_pairs[start : start + size])
            policy.append(self.actor_train.compute_sequence_log_probs(batch).batch["seq_log_prob"])
            reference.append(self.reference.compute_sequence_log_probs(batch).batch["seq_log_prob"])
        return dpo_metrics(torch.cat(policy), torch.cat(reference), self.config.beta, "val/")

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start == 0:
            self.log_metrics(0, {**self.validate(), **self.data_metrics})
        for step in self.steps(start):
            began = time.perf_counter()
            batch = self.collator([self.train_pairs[i] for i in next(self.batches)])
            reference = self.reference.compute_sequence_log_probs(batch)
            batch.batch["ref_seq_log_prob"] = reference.batch["seq_log_prob"]
            result = self.actor_train.train_step(batch)
            metrics: dict[str, Any] = dict(result.meta_info["metrics"])
            metrics["time/step_s"] = time.perf_counter() - began
            if (self.config.eval_steps and step % self.config.eval_steps == 0) or step == self.config.max_steps:
                metrics.update(self.validate())
            last = self.log_metrics(step, metrics)
            self.do_checkpoint(step, force=step == self.config.max_steps)
        if self.config.export_hf:
            self.export_hf(self.actor_train)
        return last
