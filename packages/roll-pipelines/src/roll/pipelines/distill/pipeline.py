"""The distillation pipeline: a student learns a frozen teacher's token distributions (top-k logits).

One step::

    batch = next(train_data)                                   (or: the teacher's greedy responses to prompts)
    handles = teacher.compute_topk(batch)                      top-k stays in the teacher's object store
    student.train_step(batch, TeacherLogits(handles))          each rank fetches its rows' top-k directly
    validation every eval_steps: val/loss, val/kl_to_teacher (held-out), val/correct (student_infer generates)

The driver only ever holds small handles to the teacher's top-k; see :mod:`roll.pipelines.distill.transfer`.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from roll.pipelines.base import BasePipeline, Role
from roll.pipelines.data import PromptCollator, SFTCollator
from roll.pipelines.distill.config import DistillConfig
from roll.pipelines.distill.data import generated_correctness, greedy, responses_as_sft_rows
from roll.pipelines.distill.transfer import TeacherLogits
from roll.pipelines.distill.workers import StudentWorker, TeacherWorker
from roll.pipelines.rlvr.workers import InferWorker
from roll.pipelines.stages import BatchStream, StepTimer, batched, is_eval_step, load_split, load_splits
from roll.pipelines.tokenizers import load_tokenizer
from roll.protocol import DataProto
from roll.runtime import import_target

__all__ = ["DistillPipeline"]


class DistillPipeline(BasePipeline):
    config_cls = DistillConfig
    config: DistillConfig

    def setup(self) -> None:
        cfg = self.config
        data_args = cfg.student.require_data()
        max_length = cast(int, data_args.max_length)  # DistillConfig requires it
        # 1. data: training rows (SFT rows, or prompts for sequence-level KD) and held-out prompts
        self.tokenizer = load_tokenizer(cfg.student.model_args)
        pad = self.tokenizer.pad_token_id
        task: Literal["prompt", "sft"] = "prompt" if cfg.distill.teacher_generates else "sft"
        if data_args.default_tag is None:  # prompts need a tag; distillation routes nothing by it
            data_args = data_args.model_copy(update={"default_tag": "distill"})
        self.splits = load_splits(data_args, task, self.tokenizer)
        self.val_collator = SFTCollator(pad, max_length)
        self.prompt_collator = PromptCollator(pad, cfg.validation.prompt_length)
        self.eval_rows = self.splits.eval
        self.eval_prompts: list[Any] = []
        if data_args.eval_file_name:
            if task == "sft":
                self.eval_prompts = load_split(data_args, "prompt", self.tokenizer, "eval")[0]
            else:
                self.eval_prompts, self.eval_rows = self.splits.eval, []
        fn = cfg.validation.correct_fn
        self.correct_fn = import_target(fn) if fn and cfg.student_infer is not None else None
        # 2. session; 3. roles
        self.open_session()
        roles = {
            "student": Role(StudentWorker, cfg.student, cfg.student_settings()),
            "teacher": Role(TeacherWorker, cfg.teacher, cfg.teacher_settings()),
        }
        if cfg.student_infer is not None:
            roles["student_infer"] = Role(InferWorker, cfg.student_infer)
        clusters = self.create_clusters(roles)
        self.student, self.teacher = clusters["student"], clusters["teacher"]
        self.student_infer = clusters.get("student_infer")
        # 4. wiring
        if self.student_infer is not None:
            self.set_model_update_pair(self.student, self.student_infer, frequency=10**9)  # synced for validation
        self.set_checkpoint_clusters(self.student)
        args = cfg.student.training_args
        batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.student.dp_size
        collator = (
            self.prompt_collator if task == "prompt" else SFTCollator(pad, max_length, pack=data_args.pack_sequences)
        )
        self.train_collator = SFTCollator(pad, max_length)
        self.batches = BatchStream(
            self.splits.train, batch_size, collator, seed=data_args.seed, shuffle=data_args.shuffle, drop_last=True
        )
        self.teacher_correct: float | None = None

    def data_state(self) -> dict[str, Any]:
        return {"train": self.batches.state_dict()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state["train"])

    # --- one step ---------------------------------------------------------------------------------------
    def teacher_logits(self, batch: DataProto) -> TeacherLogits:
        """The teacher's top-k of ``batch``: handles only (the arrays stay in the teacher's object store)."""
        return TeacherLogits(tuple(self.teacher.compute_topk(batch)), self.config.distill.logits_topk)

    def training_batch(self) -> DataProto:
        """The next SFT batch; for sequence-level KD the teacher first writes the responses to the prompts."""
        picked, batch = self.batches.next_indexed()
        if not self.config.distill.teacher_generates:
            return batch
        generated = self.teacher.generate(batch, greedy(self.config.validation.response_length))
        rows = responses_as_sft_rows([self.splits.train[i] for i in picked], generated)
        return self.train_collator(rows)

    def step(self, step: int) -> dict[str, Any]:
        cfg, timer = self.config, StepTimer()
        with timer.phase("data"):
            batch = self.training_batch()
        distilling = cfg.distill.distill_loss_weight > 0
        with timer.phase("teacher"):
            teacher = self.teacher_logits(batch) if distilling else None
        with timer.phase("train"):
            result = self.student.train_step(batch, teacher)
        metrics: dict[str, Any] = dict(result.meta_info["metrics"])
        if teacher is not None:
            metrics["distill/topk_mb"] = teacher.nbytes / 2**20
        metrics["epoch"] = self.batches.epoch
        if is_eval_step(step, cfg.eval_steps, self.max_steps):
            with timer.phase("validation"):
                metrics.update(self.validate(step))
        metrics.update(timer.times)
        return metrics

    # --- validation -------------------------------------------------------------------------------------
    def held_out_kl(self) -> dict[str, float]:
        """Token-mean forward KL to the teacher (on its top-k) and NLL of the held-out responses."""
        sums = {"kl_sum": 0.0, "nll_sum": 0.0, "num_tokens": 0.0, "num_targets": 0.0}
        for batch in batched(self.eval_rows, self.config.validation.batch_size, self.val_collator):
            out = self.student.evaluate(batch, self.teacher_logits(batch))
            for key in sums:
                sums[key] += float(out.batch[key].sum())
        return {
            "val/kl_to_teacher": sums["kl_sum"] / max(sums["num_tokens"], 1.0),
            "val/loss": sums["nll_sum"] / max(sums["num_targets"], 1.0),
        }

    def correctness(self, engine: Any) -> float:
        val = self.config.validation
        return generated_correctness(
            engine,
            self.eval_prompts,
            self.prompt_collator,
            self.tokenizer,
            cast(Any, self.correct_fn),
            batch_size=val.batch_size,
            max_new_tokens=val.response_length,
        )

    def validate(self, step: int) -> dict[str, float]:
        metrics = self.held_out_kl() if self.eval_rows else {}
        if self.correct_fn is not None and self.eval_prompts and self.student_infer is not None:
            metrics.update(self.model_update(step, force=True))
            metrics["val/correct"] = self.correctness(self.student_infer)
            if self.teacher_correct is None:  # the teacher is frozen: measured once, at the first validation
                self.teacher_correct = self.correctness(self.teacher)
                metrics["val/teacher_correct"] = self.teacher_correct
        return metrics

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start == 0:
            self.log_metrics(0, {**self.validate(0), **self.splits.metrics})
        for step in self.steps(start):
            last = self.log_metrics(step, self.step(step))
            self.do_checkpoint(step, force=step == self.max_steps)
        if self.config.export_hf:
            self.export_hf(self.student)
        return last
