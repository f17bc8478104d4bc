"""DPO configuration: policy and reference roles, the DPO loss (also the DPO worker's settings), validation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.data import check_task_rows
from roll.runtime import RollModel

__all__ = ["FLAT_KEYS", "DPOConfig", "DPOLossSection", "DPOValidationSection"]

FLAT_KEYS: dict[str, str] = {
    "beta": "loss.beta",
    "label_smoothing": "loss.label_smoothing",
    "loss_type": "loss.loss_type",
    "val_batch_size": "validation.batch_size",
    "val_generation_rows": "validation.generation_rows",
    "val_max_new_tokens": "validation.max_new_tokens",
}


class DPOLossSection(RollModel):
    """The preference loss; the DPO worker receives exactly this section as its settings."""

    beta: float = Field(default=0.1, gt=0, description="Strength of the implicit KL to the reference.")
    label_smoothing: float = Field(default=0.0, ge=0, le=0.5, description="Assumed share of flipped labels.")
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"


class DPOValidationSection(RollModel):
    """Held-out preference accuracy, ties and reward margin (every eval_steps and at the end); optionally greedy
    answers of the policy graded for correctness and format."""

    batch_size: int = Field(default=32, ge=1, description="Pairs per validation batch.")
    generation_rows: int = Field(
        default=0, ge=0, description="Held-out prompts answered greedily at each validation (val/correct); 0: off."
    )
    max_new_tokens: int = Field(default=32, ge=1, description="Token budget of those greedy answers.")


class DPOConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "dpo"
    actor_train: RoleConfig = Field(description="The policy being trained; its data_args hold the preference data.")
    reference: RoleConfig = Field(description="The frozen reference model (usually the same initial weights).")
    loss: DPOLossSection = Field(default_factory=DPOLossSection)
    validation: DPOValidationSection = Field(default_factory=DPOValidationSection)

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The LR schedule runs one optimizer step per pipeline step."""
        data = super().derive_defaults(data)
        cls.fill_schedule_length(data, "actor_train", 1)
        return data

    def deployment_checks(self) -> list[Callable[[], str | None]]:
        """The training and eval rows have the columns preference pairs need."""
        data = self.actor_train.require_data()
        return [functools.partial(check_task_rows, data, "preference", "actor_train.data_args")]

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
        return self
