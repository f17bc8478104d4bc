"""Knowledge distillation: a student learns a frozen teacher's top-k token distributions (ROLL's distill pipeline)."""

from __future__ import annotations

from roll.pipelines.distill.config import DistillConfig, DistillSection, DistillValidationSection
from roll.pipelines.distill.pipeline import DistillPipeline
from roll.pipelines.distill.settings import StudentSettings, TeacherSettings
from roll.pipelines.distill.transfer import TeacherLogits, TopKShard
from roll.pipelines.distill.workers import StudentWorker, TeacherWorker, student_loss

__all__ = [
    "DistillConfig",
    "DistillPipeline",
    "DistillSection",
    "DistillValidationSection",
    "StudentSettings",
    "StudentWorker",
    "TeacherLogits",
    "TeacherSettings",
    "TeacherWorker",
    "TopKShard",
    "student_loss",
]
