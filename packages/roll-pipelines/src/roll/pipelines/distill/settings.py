"""What the distillation workers are told at ``initialize``: their own settings, resolved by DistillConfig."""

from __future__ import annotations

from dataclasses import dataclass

from roll.pipelines.algorithms import KD_OBJECTIVES
from roll.runtime import ConfigError

__all__ = ["StudentSettings", "TeacherSettings"]


@dataclass(frozen=True)
class TeacherSettings:
    """The teacher's top-k: ``logits_topk`` ids (0: all) at ``temperature`` (kd x teacher temperature)."""

    logits_topk: int = 64
    temperature: float = 1.0
    distill_on_prompt: bool = False

    def __post_init__(self) -> None:
        if self.logits_topk < 0:
            raise ConfigError(f"TeacherSettings.logits_topk must be >= 0, got {self.logits_topk}")
        if not self.temperature > 0:
            raise ConfigError(f"TeacherSettings.temperature must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class StudentSettings:
    """The student's loss: ``(1 - distill_loss_weight) * CE + distill_loss_weight * kd_objective``."""

    kd_objective: str = "forward_kl"
    kd_temperature: float = 1.0
    distill_loss_weight: float = 0.5
    adaptive_kl_alpha: float = 0.5
    skew_lambda: float = 0.1
    distill_on_prompt: bool = False

    def __post_init__(self) -> None:
        if self.kd_objective not in KD_OBJECTIVES:
            raise ConfigError(f"StudentSettings.kd_objective must be one of {KD_OBJECTIVES}, got {self.kd_objective!r}")
        if not self.kd_temperature > 0:
            raise ConfigError(f"StudentSettings.kd_temperature must be > 0, got {self.kd_temperature}")
        for name in ("distill_loss_weight", "adaptive_kl_alpha", "skew_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"StudentSettings.{name} must lie in [0, 1], got {getattr(self, name)}")
