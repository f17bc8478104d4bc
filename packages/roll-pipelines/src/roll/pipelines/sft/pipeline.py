"""The SFT pipeline: next-token loss on response tokens, validation loss, checkpoints, HF export.

Per step: ``batch = next(train_data)``; ``sft_train.train_step(batch)``; every ``eval_steps`` the validation
loss (token-weighted mean NLL over the whole eval set), the loss on the final answer's tokens alone
(``val/answer_loss``: the part a fixed response template cannot lower) and, with
``validation.generation_rows``, greedy answers to held-out prompts graded for correctness and format apart
(``val/correct``, ``val/format``, ``val/exact_match``); every ``save_steps`` a checkpoint.
"""

from __future__ import annotations

import time
from typing import Any, cast

from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.data import SFTCollator
from roll.pipelines.evaluation import HeldOutAnswers, answer_loss, answer_only_examples
from roll.pipelines.sft.config import SFTConfig
from roll.pipelines.sft.workers import SFTWorker
from roll.pipelines.stages import BatchStream, batched, is_eval_step, load_splits
from roll.pipelines.tokenizers import load_tokenizer

__all__ = ["SFTPipeline"]


class SFTPipeline(BasePipeline):
    config_cls = SFTConfig
    config: SFTConfig

    def setup(self) -> None:
        cfg = self.config
        role = cfg.sft_train
        data_args = role.require_data()
        max_length = cast(int, data_args.max_length)  # SFTConfig requires it
        # 1. data: errors surface before anything starts
        self.tokenizer = load_tokenizer(role.model_args)
        self.splits = load_splits(data_args, "sft", self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.val_collator = SFTCollator(pad, max_length)
        collator = SFTCollator(pad, max_length, pack=data_args.pack_sequences)
        self.val_answers, _ = answer_only_examples(self.splits.eval, self.tokenizer)
        validation = cfg.validation
        self.held_out = HeldOutAnswers.build(
            self.splits.eval,
            self.tokenizer,
            rows=validation.generation_rows,
            max_new_tokens=validation.max_new_tokens,
            batch_size=validation.batch_size,
        )
        # 2. session; 3. roles
        self.open_session()
        self.sft_train = self.create_clusters({"sft_train": Role(SFTWorker, role)})["sft_train"]
        # 4. wiring
        self.set_checkpoint_clusters(self.sft_train)
        args = role.training_args
        batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.sft_train.dp_size
        self.batches = BatchStream(
            self.splits.train,
            batch_size,
            collator,
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
        nll, tokens = 0.0, 0
        size = self.config.validation.batch_size
        for batch in batched(self.splits.eval, size, self.val_collator):
            out = self.sft_train.compute_sequence_log_probs(batch)
            nll -= float(out.batch["seq_log_prob"].sum())
            tokens += int(out.batch["num_target_tokens"].sum())
        metrics = {"val/loss": nll / max(tokens, 1), "val/num_tokens": float(tokens)}
        metrics.update(answer_loss(self.sft_train, self.val_answers, self.val_collator, batch_size=size))
        metrics.update(self.held_out(self.sft_train))
        return metrics

    def step(self, step: int) -> dict[str, Any]:
        began = time.perf_counter()
        batch = next(self.batches)
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
            self.export_hf(self.sft_train)
        return last
