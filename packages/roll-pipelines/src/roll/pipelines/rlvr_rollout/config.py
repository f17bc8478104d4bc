"""Rollout-only RLVR configuration: the policy to roll out (prompts in its ``data_args``), reward domains, and the
``rollout`` section. ROLL's flat ``rollout_batch_size``, ``prompt_length`` and ``response_length`` are accepted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.pipelines.config import BaseConfig, RoleConfig, raw_section, raw_value
from roll.pipelines.rlvr.config import fill_reward_tags, sync_max_new_tokens
from roll.pipelines.rlvr.sections import RewardConfig
from roll.pipelines.rlvr_rollout.writer import ROLLOUT_FIELDS
from roll.runtime import RollModel
from roll.strategies import GenerationConfig

__all__ = ["FLAT_KEYS", "RLVRRolloutConfig", "RolloutOnlySection"]

FLAT_KEYS: dict[str, str] = {
    "rollout_batch_size": "rollout.batch_size",
    "prompt_length": "rollout.prompt_length",
    "response_length": "rollout.response_length",
}


class RolloutOnlySection(RollModel):
    """What each batch (step) generates."""

    batch_size: int = Field(default=64, ge=1, description="Prompts per batch (step); each gets n samples.")
    prompt_length: int = Field(default=256, ge=1, description="Longest prompt in tokens (longer prompts are dropped).")
    response_length: int = Field(
        default=GenerationConfig.model_fields["max_new_tokens"].default,
        ge=1,
        description="max_new_tokens of the rollouts (default: actor_infer.generating_args.max_new_tokens).",
    )


class RLVRRolloutConfig(BaseConfig):
    """Generation + rewards only. Roles: ``actor_infer`` (with the prompts in its ``data_args``) and ``rewards``."""

    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "rlvr_rollout"
    actor_infer: RoleConfig = Field(
        description="The policy to roll out (e.g. vllm or hf_infer); data_args holds the prompts, generating_args "
        "the sampling (num_return_sequences n gives pass@n)."
    )
    rewards: dict[str, RewardConfig] = Field(description="Reward domains, as in rlvr: {math: {reward_type: math}}.")
    split: Literal["train", "eval"] = Field(
        default="train", description="Roll out data_args.file_name ('train') or data_args.eval_file_name ('eval')."
    )
    rollout: RolloutOnlySection = Field(default_factory=RolloutOnlySection)
    max_steps: int | None = Field(  # type: ignore[assignment]
        default=None, ge=1, description="Batches to roll out; null: every prompt exactly once."
    )
    save_steps: int = Field(
        default=1, ge=0, description="Checkpoint every N steps (data cursor, totals and metrics; no model state)."
    )
    export_hf: bool = Field(default=False, description="Unused: nothing is trained.")

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Reward tags; ``rollout.response_length`` and ``actor_infer``'s max_new_tokens follow whichever is set."""
        data = super().derive_defaults(data)
        fill_reward_tags(data)
        length = raw_value(data, "rollout", "response_length")
        if length is None:
            length = raw_value(data, "actor_infer", "generating_args", "max_new_tokens")
            rollout = raw_section(data, "rollout", create=True) if length is not None else None
            if rollout is not None:
                rollout["response_length"] = length
        sync_max_new_tokens(data, "actor_infer", length)
        return data

    @model_validator(mode="after")
    def _check_rollout(self) -> RLVRRolloutConfig:
        data = self.actor_infer.data_args
        if data is None:
            raise ValueError("actor_infer.data_args is required: file_name with the prompts to roll out")
        if self.split == "eval" and not data.eval_file_name:
            raise ValueError("split=eval rolls out actor_infer.data_args.eval_file_name, which is not set")
        if not self.rewards:
            raise ValueError("rewards needs at least one domain, e.g. rewards: {math: {reward_type: math}}")
        clashes = sorted(set(data.extra_keys) & set(ROLLOUT_FIELDS))
        if clashes:
            raise ValueError(f"data_args.extra_keys {clashes} clash with rollouts.jsonl fields; rename those columns")
        return self
