"""The distillation roles: the teacher (top-k distributions, and responses for sequence-level KD) and the student
(cross-entropy + KD divergence on the teacher's top-k, and held-out KL to the teacher).

Batches are SFT batches (``input_ids``, ``attention_mask``, ``position_ids``, ``labels``, ``loss_mask``; packed rows
add ``segment_ids``); the teacher's distributions travel as :class:`~roll.pipelines.distill.transfer.TeacherLogits`.
"""

from __future__ import annotations

import torch

from roll.pipelines.algorithms import gather_student_logits, kd_divergence, kd_loss, teacher_topk
from roll.pipelines.distill.settings import StudentSettings, TeacherSettings
from roll.pipelines.distill.transfer import TeacherLogits, TopKShard, pack_topk, put_topk, target_mask, unpack_topk
from roll.pipelines.workers import LogProbWorker
from roll.protocol import DataProto, Dispatch, register
from roll.strategies import SHARE, GenerationConfig, LossScale, StrategyWorker
from roll.strategies.ops import language_model_loss

__all__ = ["StudentWorker", "TeacherWorker", "student_loss"]


class TeacherWorker(StrategyWorker):
    """teacher: top-k log-probs of every distilled position, put in the object store; and generation."""

    settings: TeacherSettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: TeacherSettings | None = None) -> None:
        super().initialize(settings or TeacherSettings())

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def compute_topk(self, batch: DataProto) -> list[TopKShard]:
        """One handle per rank to this rank's rows' packed top-k (see transfer.pack_topk); nothing else returns."""
        k, temperature = self.settings.logits_topk, self.settings.temperature
        vocab: list[int] = []

        def forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
            vocab.append(logits.shape[-1])
            top = teacher_topk(logits[:, :-1], k, temperature)
            out = {"log_probs": top.log_probs}
            if top.indices is not None:
                out["indices"] = top.indices.to(torch.int32)
            return out

        if not len(batch):
            return []
        out = self.strategy.forward_step(batch, forward)
        mask = target_mask(batch, self.settings.distill_on_prompt)
        packed = pack_topk(out["log_probs"], out.get("indices"), mask, max(vocab))
        return [put_topk(packed, rows=len(batch))]

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        """Left-padded prompts in; rows per the generation layout of roll.strategies.base out."""
        return self.strategy.generate(batch, generation_config)


def student_loss(
    settings: StudentSettings, micro: DataProto, logits: torch.Tensor, scale: LossScale
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(1 - w) * CE(labels) + w * divergence(student, teacher top-k)``, each a token sum over the mini-batch's
    ``scale.num_tokens`` target tokens; with w = 0 the teacher's tensors are not read (plain SFT)."""
    w = settings.distill_loss_weight
    ce, _ = language_model_loss(logits, micro.batch["labels"], num_tokens=scale.num_tokens)
    metrics = {f"student/ce_loss{SHARE}": float(ce.detach())}
    if w == 0:
        return ce, metrics
    per_token = _divergence(settings, micro, logits)
    kd = kd_loss(per_token, target_mask(micro, settings.distill_on_prompt), num_tokens=scale.num_tokens)
    metrics[f"student/distill_loss{SHARE}"] = float(kd.detach())
    return (1 - w) * ce + w * kd, metrics


def _divergence(settings: StudentSettings, micro: DataProto, logits: torch.Tensor, objective: str = "") -> torch.Tensor:
    data = micro.batch
    ids = data["teacher_ids"] if "teacher_ids" in data.keys() else None
    return kd_divergence(
        gather_student_logits(logits[:, :-1], ids),
        data["teacher_log_probs"],
        objective or settings.kd_objective,
        temperature=settings.kd_temperature,
        skew_lambda=settings.skew_lambda,
        adaptive_alpha=settings.adaptive_kl_alpha,
    )


class StudentWorker(LogProbWorker):
    """student: trains on cross-entropy + KD; ``initialize(settings)`` takes :class:`StudentSettings`."""

    settings: StudentSettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: StudentSettings | None = None) -> None:
        super().initialize(settings or StudentSettings())

    def _with_teacher(self, batch: DataProto, teacher: TeacherLogits) -> DataProto:
        """This rank's rows of the teacher's top-k, fetched from the teacher's object store, added to ``batch``."""
        info = self.rank_info
        base, extra = divmod(teacher.rows, info.dp_size)
        start = info.dp_rank * base + min(info.dp_rank, extra)
        packed = teacher.fetch(start, start + len(batch))
        dense = unpack_topk(packed, target_mask(batch, self.settings.distill_on_prompt), teacher.k)
        return batch.union(DataProto.from_dict(dense))

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto, teacher: TeacherLogits | None = None) -> DataProto:
        """One optimizer step on ``batch`` with the teacher's top-k (None only with distill_loss_weight 0)."""
        settings = self.settings
        if teacher is not None and settings.distill_loss_weight > 0:
            batch = self._with_teacher(batch, teacher)

        def loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
            return student_loss(settings, micro, logits, scale)

        metrics = self.train_strategy.train_step(batch, loss, loss_mask_key="loss_mask")
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def evaluate(self, batch: DataProto, teacher: TeacherLogits) -> DataProto:
        """Per row: ``kl_sum`` (forward KL to the teacher on its top-k, summed over distilled tokens),
        ``nll_sum`` (target tokens' negative log-likelihood) and ``num_tokens``."""
        batch = self._with_teacher(batch, teacher)
        settings = self.settings

        def forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
            mask = target_mask(micro, settings.distill_on_prompt)
            kl = _divergence(settings, micro, logits, "forward_kl") * mask
            targets = micro.batch["loss_mask"][:, 1:]
            labels = torch.where(targets, micro.batch["input_ids"][:, 1:], 0)
            log_probs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            return {
                "kl_sum": kl.sum(-1),
                "nll_sum": -(log_probs * targets).sum(-1),
                "num_tokens": mask.sum(-1),
                "num_targets": targets.sum(-1),
            }

        return DataProto.from_dict(self.strategy.forward_step(batch, forward))
