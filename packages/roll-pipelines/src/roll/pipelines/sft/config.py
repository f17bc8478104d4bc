"""SFT configuration: the trained role (its data in ``data_args``) and the validation section."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

from roll.pipelines.config import BaseConfig, RoleConfig
from roll.pipelines.data import check_task_rows
from roll.runtime import RollModel

__all__ = ["FLAT_KEYS", "SFTConfig", "SFTValidationSection"]

FLAT_KEYS: dict[str, str] = {
    "val_batch_size": "validation.batch_size",
    "val_generation_rows": "validation.generation_rows",
    "val_max_new_tokens": "validation.max_new_tokens",
}


class SFTValidationSection(RollModel):
    """Validation over the whole eval set (every eval_steps and at the end): the loss on all target tokens and
    on the final answer's tokens alone, and optionally greedy answers graded for correctness and format."""

    batch_size: int = Field(default=64, ge=1, description="Rows per validation batch.")
    generation_rows: int = Field(
        default=0, ge=0, description="Held-out examples answered greedily at each validation (val/correct); 0: off."
    )
    max_new_tokens: int = Field(default=32, ge=1, description="Token budget of those greedy answers.")


class SFTConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "sft"
    sft_train: RoleConfig = Field(description="The trained model (strategy e.g. fsdp2_train); data in data_args.")
    validation: SFTValidationSection = Field(default_factory=SFTValidationSection)

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The LR schedule runs one optimizer step per pipeline step."""
        data = super().derive_defaults(data)
        cls.fill_schedule_length(data, "sft_train", 1)
        return data

    def deployment_checks(self) -> list[Callable[[], str | None]]:
        """The training and eval rows have the columns SFT reads."""
        return [functools.partial(check_task_rows, self.sft_train.require_data(), "sft", "sft_train.data_args")]

    @model_validator(mode="after")
    def _check_sft(self) -> SFTConfig:
        if self.sft_train.data_args is None:
            raise ValueError("sft_train.data_args is required: set file_name (and eval_file_name for validation)")
        if self.sft_train.data_args.max_length is None:
            raise ValueError("sft_train.data_args.max_length is required (longest prompt + response, in tokens)")
        return self
