"""On-policy distillation (OPD) in RLVR: the student samples, a frozen ``teacher`` scores the samples' log-probs,
and the per-token reverse-KL estimate becomes (part of) the advantage.

ROLL's keys and semantics:

* ``is_pure_opd: true`` (``opd.pure``): ``advantage = -opd_kl_coef * (log p_student - log p_teacher)`` per token
  (``opd.penalty`` picks the KL estimate; ``k1`` is that log-ratio). The reward domains and the advantage
  estimator take no part in training: training rollouts are not scored at all, and the reward domains only
  score validation. ROLL's ``student_train`` / ``student_infer`` spellings of ``actor_train`` / ``actor_infer``
  are accepted in this mode.
* ``use_opd: true`` (``opd.mixed``): the estimator's reward-based advantage minus ``opd_kl_coef`` times the same
  KL estimate (before whitening and clipping), as ROLL adds it.

The student's log-probs are the old log-probs of the step (a recompute pass or the rollout engine's); the teacher
scores at the sampling temperature, as the reference does.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from roll.pipelines.algorithms import masked_mean, opd_advantages
from roll.pipelines.config import RoleConfig
from roll.runtime import RollModel

__all__ = ["OPD_FLAT_KEYS", "OPDSection", "TeacherConfig", "apply_opd", "map_student_roles"]

OPD_FLAT_KEYS: dict[str, str] = {"is_pure_opd": "opd.pure", "use_opd": "opd.mixed", "opd_kl_penalty": "opd.penalty"}


class TeacherConfig(RoleConfig):
    """The OPD teacher: a frozen model that scores the student's samples (e.g. hf_infer or fsdp2_infer)."""

    opd_kl_coef: float = Field(default=1.0, ge=0, description="Weight of the teacher's reverse-KL term.")


class OPDSection(RollModel):
    """On-policy distillation: pure (the teacher's KL is the whole advantage) or mixed (added to the reward's)."""

    pure: bool = Field(default=False, description="is_pure_opd: advantage = -coef * KL(student || teacher) only.")
    mixed: bool = Field(default=False, description="use_opd: reward-based advantage - coef * KL(student || teacher).")
    penalty: Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"] = Field(
        default="k1", description="The per-token KL estimate; k1 is log p_student - log p_teacher."
    )

    @model_validator(mode="after")
    def _exclusive(self) -> OPDSection:
        if self.pure and self.mixed:
            raise ValueError(
                "is_pure_opd (opd.pure) and use_opd (opd.mixed) are exclusive: pure OPD trains on the teacher's KL "
                "alone, mixed OPD adds it to the reward-based advantage; set only one"
            )
        return self

    @property
    def on(self) -> bool:
        return self.pure or self.mixed


def map_student_roles(data: dict[str, Any]) -> None:
    """ROLL's pure-OPD role names: ``student_train`` -> ``actor_train``, ``student_infer`` -> ``actor_infer``."""
    for student, actor in (("student_train", "actor_train"), ("student_infer", "actor_infer")):
        if student not in data:
            continue
        if data.get(actor) is not None:
            raise ValueError(f"{student} and {actor} name the same role and both are set; keep only one")
        data[actor] = data.pop(student)


def apply_opd(
    data: Any, advantages: torch.Tensor | None, mask: torch.Tensor, section: OPDSection, coef: float
) -> tuple[torch.Tensor, dict[str, float]]:  # data: the batch's TensorDict
    """The OPD advantage (pure: ``advantages`` is None) or the mixed one, from ``old_log_probs`` and
    ``teacher_log_probs`` of the batch tensors ``data``; metrics: the teacher KL of the samples."""
    student, teacher = data["old_log_probs"].float(), data["teacher_log_probs"].float()
    opd = opd_advantages(student, teacher, mask, coef, section.penalty)
    metrics = {
        "opd/reverse_kl": float(masked_mean(student - teacher, mask)),
        "opd/advantage_mean": float(masked_mean(opd, mask)),
    }
    return (opd if advantages is None else advantages + opd), metrics
