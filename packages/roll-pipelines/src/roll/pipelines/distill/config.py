"""Distillation configuration: roles (student, teacher, optional student_infer) and the ``distill`` and
``validation`` sections. ROLL's flat keys (``logits_topk``, ``kd_objective``, ``kd_temperature``,
``teacher_temperature``, ``distill_loss_weight``, ``adaptive_kl_alpha``, ``skew_lambda``, ``distill_on_prompt``)
are accepted and moved into ``distill``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.data import check_task_rows
from roll.pipelines.distill.settings import StudentSettings, TeacherSettings
from roll.runtime import RollModel

__all__ = ["FLAT_KEYS", "DistillConfig", "DistillSection", "DistillValidationSection"]

FLAT_KEYS: dict[str, str] = {
    "logits_topk": "distill.logits_topk",
    "kd_objective": "distill.kd_objective",
    "kd_temperature": "distill.kd_temperature",
    "teacher_temperature": "distill.teacher_temperature",
    "distill_loss_weight": "distill.distill_loss_weight",
    "adaptive_kl_alpha": "distill.adaptive_kl_alpha",
    "skew_lambda": "distill.skew_lambda",
    "distill_on_prompt": "distill.distill_on_prompt",
    "val_batch_size": "validation.batch_size",
}

KDObjective = Literal[
    "forward_kl", "reverse_kl", "adaptive_kl", "skewed_forward_kl", "skewed_reverse_kl", "js_divergence"
]


class DistillSection(RollModel):
    """What the student learns from the teacher (roll.pipelines.algorithms.distill has the maths)."""

    logits_topk: int = Field(default=64, ge=0, description="Teacher ids per token (0: the whole vocabulary).")
    kd_objective: KDObjective = "forward_kl"
    kd_temperature: float = Field(default=1.0, gt=0, description="Divides student and teacher logits.")
    teacher_temperature: float = Field(default=1.0, gt=0, description="Divides the teacher's logits too.")
    distill_loss_weight: float = Field(
        default=0.5, ge=0, le=1, description="loss = (1 - w) * cross-entropy + w * divergence (0: plain SFT)."
    )
    adaptive_kl_alpha: float = Field(default=0.5, ge=0, le=1, description="adaptive_kl: tail mass of the teacher.")
    skew_lambda: float = Field(default=0.1, ge=0, le=1, description="skewed_*_kl: the mixture weight.")
    distill_on_prompt: bool = Field(default=False, description="Distill every token (prompt too), not only targets.")
    teacher_generates: bool = Field(
        default=False,
        description=(
            "Sequence-level KD: the data holds prompts only; each step the teacher writes the responses (greedy, "
            "validation.response_length tokens) and the student learns them with the teacher's top-k."
        ),
    )


class DistillValidationSection(RollModel):
    """Held-out validation: loss and KL to the teacher every eval_steps; generated correctness with student_infer."""

    batch_size: int = Field(default=64, ge=1, description="Rows per validation batch.")
    response_length: int = Field(default=24, ge=1, description="Tokens generated per held-out prompt.")
    prompt_length: int = Field(default=64, ge=1, description="Longest prompt in tokens.")
    correct_fn: str | None = Field(
        default="roll.pipelines.distill.data:states_correct_answer",
        description="'module:function' (prompt, response) -> bool for val/correct (None: no generation).",
    )


class DistillConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "distill"
    student: RoleConfig = Field(description="The trained model (e.g. fsdp2_train); its data_args hold the data.")
    teacher: RoleConfig = Field(description="The frozen teacher (hf_infer, fsdp2_infer, megatron_infer...).")
    student_infer: RoleConfig | None = Field(
        default=None, description="Generation engine for val/correct (e.g. hf_infer), synced from student."
    )
    distill: DistillSection = Field(default_factory=DistillSection)
    validation: DistillValidationSection = Field(default_factory=DistillValidationSection)

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The LR schedule runs one optimizer step per pipeline step."""
        data = super().derive_defaults(data)
        cls.fill_schedule_length(data, "student", 1)
        return data

    def student_settings(self) -> StudentSettings:
        d = self.distill
        return StudentSettings(
            kd_objective=d.kd_objective,
            kd_temperature=d.kd_temperature,
            distill_loss_weight=d.distill_loss_weight,
            adaptive_kl_alpha=d.adaptive_kl_alpha,
            skew_lambda=d.skew_lambda,
            distill_on_prompt=d.distill_on_prompt,
        )

    def teacher_settings(self) -> TeacherSettings:
        d = self.distill
        return TeacherSettings(
            logits_topk=d.logits_topk,
            temperature=d.kd_temperature * d.teacher_temperature,
            distill_on_prompt=d.distill_on_prompt,
        )

    def deployment_checks(self) -> list[Callable[[], str | None]]:
        """The training and eval rows have the columns the student's data needs (prompts when the teacher
        generates the responses; the pipeline tags them itself)."""
        data = self.student.require_data()
        if self.distill.teacher_generates:
            task: Literal["prompt", "sft"] = "prompt"
            data = data if data.default_tag is not None else data.model_copy(update={"default_tag": "distill"})
        else:
            task = "sft"
        return [functools.partial(check_task_rows, data, task, "student.data_args")]

    @model_validator(mode="after")
    def _check_distill(self) -> DistillConfig:
        data_args = self.student.data_args
        if data_args is None:
            raise ValueError("student.data_args is required: file_name (and eval_file_name for validation)")
        if data_args.max_length is None:
            raise ValueError("student.data_args.max_length is required (longest prompt + response, in tokens)")
        if self.distill.teacher_generates and data_args.pack_sequences:
            raise ValueError("distill.teacher_generates writes fresh responses each step: set pack_sequences false")
        return self
