"""The SFT pipeline: next-token loss on response tokens, validation loss, checkpoints, HF export.

Per step: ``batch = next(train_data)``; ``sft_train.train_step(batch)``; every ``eval_steps`` the validation
loss (token-weighted mean NLL over the whole eval set); every ``save_steps`` a checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from pydantic import Field, model_validator

from roll.pipelines.base import BasePipeline
from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.data import SFTCollator, StatefulBatchIterator, load_task_rows, prepare_examples
from roll.pipelines.tokenizers import load_tokenizer
from roll.pipelines.workers import LogProbWorker
from roll.protocol import DataProto, Dispatch, register
from roll.strategies import LossScale
from roll.strategies.ops import language_model_loss

__all__ = ["SFTConfig", "SFTPipeline", "SFTWorker"]


class SFTConfig(BaseConfig):
    pipeline_cls: str = "sft"
    sft_train: RoleConfig = Field(description="The trained model (strategy e.g. fsdp2_train); data in data_args.")
    val_batch_size: int = Field(default=64, ge=1, description="Rows per validation batch.")

    @model_validator(mode="after")
    def _check_sft(self) -> SFTConfig:
        if self.sft_train.data_args is None:
            raise ValueError("sft_train.data_args is required: set file_name (and eval_file_name for validation)")
        if self.sft_train.data_args.max_length is None:
            raise ValueError("sft_train.data_args.max_length is required (longest prompt + response, in tokens)")
        self.fill_training_steps(self.sft_train)
        return self


class SFTWorker(LogProbWorker):
    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto) -> DataProto:
        metrics = self.train_strategy.train_step(batch, _sft_loss, loss_mask_key="loss_mask")
        return DataProto(meta_info={"metrics": metrics})


def _sft_loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    loss, _ = language_model_loss(logits, micro.batch["labels"], num_tokens=scale.num_tokens)
    return loss, {}


class SFTPipeline(BasePipeline):
    config_cls = SFTConfig
    config: SFTConfig

    def prepare_data(self) -> None:
        role = self.config.sft_train
        data_args = role.data_args
        self.tokenizer = load_tokenizer(role.model_args)
        rows = load_task_rows(data_args, "sft")
        self.train_examples, report = prepare_examples(rows, "sft", self.tokenizer, data_args, name="train")
        self.data_metrics = report.as_metrics("data/train")
        self.val_examples = []
        if data_args.eval_file_name:
            val_rows = load_task_rows(data_args, "sft", split="eval")
            self.val_examples, val_report = prepare_examples(val_rows, "sft", self.tokenizer, data_args, name="eval")
            self.data_metrics.update(val_report.as_metrics("data/eval"))
        self.collator = SFTCollator(self.tokenizer.pad_token_id, data_args.max_length, pack=data_args.pack_sequences)
        self.val_collator = SFTCollator(self.tokenizer.pad_token_id, data_args.max_length)

    def __init__(self, config: SFTConfig) -> None:
        super().__init__(config)
        role, data_args = config.sft_train, config.sft_train.data_args
        self.sft_train = self.create_clusters_parallel({"sft_train": (SFTWorker, role)})["sft_train"]
        self.set_checkpoint_clusters(self.sft_train)
        args = role.training_args
        self.batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.sft_train.dp_size
        self.batches = StatefulBatchIterator(
            len(self.train_examples),
            self.batch_size,
            seed=data_args.seed,
            shuffle=data_args.shuffle,
            drop_last=data_args.drop_last,
        )

    def data_state(self) -> dict[str, Any]:
        return {"train": self.batches.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state["train"])

    def validate(self) -> dict[str, float]:
        if not self.val_examples:
            return {}
        nll, tokens = 0.0, 0
        size = self.config.val_batch_size
        for start in range(0, len(self.val_examples), size):
            batch = self.val_collator(self.val_examples[start : start + size])
            out = self.sft_train.compute_sequence_log_probs(batch)
            nll -= float(out.batch["seq_log_prob"].sum())
            tokens += int(out.batch["num_target_tokens"].sum())
        return {"val/loss": nll / max(tokens, 1), "val/num_tokens": float(tokens)}

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start == 0:
            self.log_metrics(0, {**self.validate(), **self.data_metrics})
        eval_every = self.config.eval_steps
        for step in self.steps(start):
            began = time.perf_counter()
            batch = self.collator([self.train_examples[i] for i in next(self.batches)])
            result = self.sft_train.train_step(batch)
            metrics: dict[str, Any] = dict(result.meta_info["metrics"])
            elapsed = time.perf_counter() - began
            metrics.update(
                {
                    "time/step_s": elapsed,
                    "tokens_per_s": batch.meta_info["num_target_tokens"] / elapsed,
                    "epoch": self.batches.epoch,
                }
            )
            if (eval_every and step % eval_every == 0) or step == self.config.max_steps:
                metrics.update(self.validate())
            last = self.log_metrics(step, metrics)
            self.do_checkpoint(step, force=step == self.config.max_steps)
        if self.config.export_hf:
            self.export_hf(self.sft_train)
        return last
