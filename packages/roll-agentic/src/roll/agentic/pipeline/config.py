"""The agentic pipeline's configuration: roles, envs (ROLL's keys), and the algorithm in sections.

Roles: ``actor_train`` (trained policy), ``actor_infer`` (rollout engine), optional ``reference`` (KL) and
``critic`` (GAE). Envs: ``custom_envs`` and the ``train_env_manager`` / ``val_env_manager`` EnvironmentWorker
roles of :mod:`roll.agentic.config`. Sections: ``rollout``, ``update``, ``advantage``, ``policy_loss``, ``kl`` and
``warmup`` (behaviour cloning of a scripted expert before RL). ROLL's flat keys (``rollout_batch_size``,
``adv_estimator``, ``episode_reward_weight``, ``ratio_type``, ...) are moved into their sections by
:data:`FLAT_KEYS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, RewardNormalizationConfig
from roll.pipelines.algorithms.train_infer import RatioDiffFilter
from roll.pipelines.config import BaseConfig, RoleConfig, field_default, is_int, raw_section, raw_value
from roll.pipelines.rlvr.config import TrainInferFilterConfig
from roll.pipelines.rlvr.settings import PolicySettings
from roll.runtime import RollModel

__all__ = [
    "FLAT_KEYS",
    "STEP_ESTIMATORS",
    "TRAJ_ESTIMATORS",
    "AgenticAdvantageSection",
    "AgenticConfig",
    "AgenticCorrectionSection",
    "AgenticPolicyLossSection",
    "AgenticRolloutSection",
    "WarmupSection",
]

FLAT_KEYS: dict[str, str] = {
    "rollout_batch_size": "rollout.batch_size",
    "val_batch_size": "rollout.val_batch_size",
    "sequence_length": "rollout.sequence_length",
    "model_update_frequency": "rollout.model_update_frequency",
    "rollout_dump": "rollout.dump",
    "ppo_epochs": "update.epochs",
    "ppo_mini_batch_size": "update.mini_batch_size",
    "batch_adjust_mode": "update.batch_adjust_mode",
    "critic_warmup": "update.critic_warmup",
    "adv_estimator": "advantage.estimator",
    "gamma": "advantage.gamma",
    "lambd": "advantage.lam",
    "episode_reward_weight": "advantage.episode_reward_weight",
    "step_reward_weight": "advantage.step_reward_weight",
    "step_reward_gamma": "advantage.step_reward_gamma",
    "whiten_advantages": "advantage.whiten",
    "advantage_clip": "advantage.clip",
    "reward_clip": "advantage.reward_clip",
    "pg_clip": "policy_loss.clip",
    "pg_clip_low": "policy_loss.clip_low",
    "pg_clip_high": "policy_loss.clip_high",
    "dual_clip_loss": "policy_loss.dual_clip",
    "ratio_type": "policy_loss.ratio_type",
    "loss_agg_mode": "policy_loss.loss_agg_mode",
    "entropy_loss_coef": "policy_loss.entropy_coef",
    "use_kl_loss": "kl.use_loss",
    "kl_loss_coef": "kl.loss_coef",
    "kl_penalty": "kl.penalty",
}

Estimator = Literal["grpo", "reinforce", "gae", "gigpo", "step_reinforce", "agentic_reinforce"]
TRAJ_ESTIMATORS = ("grpo", "reinforce", "gae", "agentic_reinforce")
"""Estimators for trajectory-wise samples (one row per episode)."""
STEP_ESTIMATORS = ("grpo", "reinforce", "gigpo", "step_reinforce")
"""Estimators for step-wise samples (one row per turn)."""


class AgenticRolloutSection(RollModel):
    """What one step plays, and where the envs run."""

    batch_size: int = Field(default=32, ge=1, description="Episodes per step (a multiple of group_size).")
    val_batch_size: int | None = Field(
        default=None, ge=1, description="Validation episodes (default: every val group once)."
    )
    sequence_length: int = Field(default=1024, ge=16, description="Longest prompt + response of a sample.")
    model_update_frequency: int = Field(default=1, ge=1, description="Sync actor_train -> actor_infer every N steps.")
    env_workers: Literal["ray", "local"] = Field(
        default="ray", description="ray: envs in EnvironmentWorker actors; local: in the driver (small runs)."
    )
    dump: bool = Field(default=False, description="Write every step's episodes to rollouts/step-N.jsonl.")


class UpdateSection(RollModel):
    epochs: int = Field(default=1, ge=1, description="Passes over the step's samples (PPO epochs).")
    mini_batch_size: int | None = Field(default=None, ge=1, description="Rows per optimizer step (default: all).")
    batch_adjust_mode: Literal["none", "copy", "delete", "auto", "random_sample"] = Field(
        default="copy",
        description="Step-wise batches vary in rows: make them a multiple of actor_train's data-parallel size "
        "by repeating the first rows (copy, ROLL's default) or deleting the last ones (delete); auto: copy when "
        "at least half would go, else delete; random_sample (ROLL's): keep one random batch unit of rows "
        "(actor_train's rows per optimizer step over its ranks, lcm'd with the scoring roles' forward batches); "
        "none: must fit.",
    )
    critic_warmup: int = Field(default=0, ge=0, description="Steps that train only the critic.")

    def num_mini_batches(self, rows: int) -> int:
        return max(1, -(-rows // (self.mini_batch_size or rows or 1)))


class AgenticAdvantageSection(RollModel):
    """Estimator and its weights; ``reward_normalization`` (top level, ROLL's key) normalizes scores before it."""

    estimator: Estimator = "grpo"
    gamma: float = Field(default=1.0, ge=0, le=1, description="Token-level discount (turn-level: agentic_reinforce).")
    lam: float = Field(default=1.0, ge=0, le=1, description="GAE lambda.")
    episode_reward_weight: float = Field(default=1.0, ge=0, description="GiGPO: weight of the episode part.")
    step_reward_weight: float = Field(default=1.0, ge=0, description="GiGPO: weight of the step (state) part.")
    step_reward_gamma: float = Field(default=0.95, ge=0, le=1, description="Discount of step returns (step-wise).")
    whiten: bool = Field(default=False, description="Whiten advantages over the batch.")
    clip: float | None = Field(default=None, gt=0, description="Clip advantages to [-clip, clip].")
    reward_clip: float | None = Field(
        default=None,
        gt=0,
        description="ROLL's reward_clip: clamp the normalized response-level rewards to [-clip, clip], and the token "
        "rewards again (turn rewards of agentic_reinforce, GAE's), before the estimator.",
    )


class AgenticPolicyLossSection(RollModel):
    clip: float = Field(default=0.2, gt=0)
    clip_low: float | None = Field(default=None, gt=0)
    clip_high: float | None = Field(default=None, gt=0)
    dual_clip: float | None = Field(default=None, gt=1)
    ratio_type: Literal["token", "segment"] = Field(
        default="token", description="segment: one ratio per assistant turn (mean log-ratio over its tokens)."
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    entropy_coef: float = Field(default=0.0, ge=0)


class KLSection(RollModel):
    use_loss: bool = Field(default=False, description="KL to the reference as a loss term (needs reference).")
    loss_coef: float = Field(default=0.001, ge=0)
    penalty: Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"] = "k3"


class WarmupSection(RollModel):
    """Behaviour cloning before RL: episodes of a scripted policy (e.g. a noisy planner) as SFT targets."""

    steps: int = Field(default=0, ge=0, description="Warm-up optimizer steps (0: none).")
    episodes_per_step: int = Field(default=32, ge=1, description="Expert episodes per warm-up step.")
    policy: str = Field(
        default="roll.agentic.policy.expert:FrozenLakeExpert", description="'module:Class' of a text policy."
    )
    policy_kwargs: dict[str, Any] = Field(default_factory=dict, description="e.g. {noise: 0.5}.")
    seed: int = Field(default=1_000_003, description="Base seed of the warm-up episodes (not the RL seeds).")


class AgenticCorrectionSection(RollModel):
    """ROLL's train_infer_correction filters: turns (segment), responses or tokens whose recomputed old log-probs
    disagree with the rollout engine's leave the loss (see roll.pipelines.algorithms.train_infer)."""

    filters: list[TrainInferFilterConfig] = Field(
        default_factory=list,
        description="Applied in order after the advantages; old log-probs are recomputed when one is enabled.",
    )

    @property
    def filter_rules(self) -> list[RatioDiffFilter]:
        return [f.rule() for f in self.filters if f.enabled]


class AgenticConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "agentic"
    actor_train: RoleConfig = Field(description="The trained policy (e.g. fsdp2_train).")
    actor_infer: RoleConfig = Field(description="The rollout engine (hf_infer, vllm); generating_args per turn.")
    reference: RoleConfig | None = Field(default=None, description="Frozen reference; created when kl.use_loss.")
    critic: RoleConfig | None = Field(default=None, description="Value model; required by estimator gae.")
    custom_envs: dict[str, CustomEnvConfig] = Field(description="Env tags: {FrozenLake: {env_type: frozen_lake}}.")
    train_env_manager: EnvManagerConfig = Field(description="Training env groups (num_env_groups, group_size, tags).")
    val_env_manager: EnvManagerConfig | None = Field(default=None, description="Held-out validation env groups.")
    reward_normalization: RewardNormalizationConfig = Field(default_factory=RewardNormalizationConfig)
    rollout: AgenticRolloutSection = Field(default_factory=AgenticRolloutSection)
    update: UpdateSection = Field(default_factory=UpdateSection)
    advantage: AgenticAdvantageSection = Field(default_factory=AgenticAdvantageSection)
    policy_loss: AgenticPolicyLossSection = Field(default_factory=AgenticPolicyLossSection)
    kl: KLSection = Field(default_factory=KLSection)
    warmup: WarmupSection = Field(default_factory=WarmupSection)
    correction: AgenticCorrectionSection = Field(default_factory=AgenticCorrectionSection)
    max_rl_time_s: float | None = Field(
        default=None, gt=0, description="Stop RL once this much wall time has passed (then validate); None: no limit."
    )

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Manager names, GRPO's default grouping, and the actor's LR schedule length (RL + warm-up steps)."""
        data = super().derive_defaults(data)
        for key, name in (("train_env_manager", "train_env"), ("val_env_manager", "val_env")):
            section = raw_section(data, key)
            if section is not None and section.get("name") in (None, "worker"):
                section["name"] = name
        estimator = raw_value(data, "advantage", "estimator", default="grpo")
        if estimator == "grpo" and raw_value(data, "reward_normalization") is None:
            data["reward_normalization"] = {"grouping": "traj_group_id", "method": "mean_std"}
        epochs = raw_value(data, "update", "epochs", default=1)
        warmup = raw_value(data, "warmup", "steps", default=0)
        max_steps = data.get("max_steps", field_default(cls, "max_steps"))
        training = raw_section(data, "actor_train", "training_args", create=True) if data.get("actor_train") else None
        if (
            training is not None
            and training.get("max_steps") is None
            and all(is_int(v) for v in (epochs, warmup, max_steps))
        ):  # one optimizer step per epoch (mini-batches of step-wise batches vary) plus the warm-up's
            training["max_steps"] = max_steps * epochs + warmup
        return data

    # --- derived views ------------------------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """``traj`` or ``step``: the sample layout of the training manager's envs."""
        kinds = {self.custom_envs[tag].env_manager_cls for tag in self.train_env_manager.tags}
        return "step" if kinds == {"step"} else "traj"

    @property
    def sampling_temperature(self) -> float:
        temperature = self.actor_infer.generating_args.temperature
        return temperature if temperature > 0 else 1.0

    @property
    def needs_reference(self) -> bool:
        return self.kl.use_loss and self.kl.loss_coef > 0

    def policy_settings(self) -> PolicySettings:
        return PolicySettings(temperature=self.sampling_temperature)

    def actor_settings(self) -> Any:
        from roll.agentic.pipeline.workers import AgenticActorSettings

        loss = self.policy_loss
        return AgenticActorSettings(
            temperature=self.sampling_temperature,
            clip_low=loss.clip_low or loss.clip,
            clip_high=loss.clip_high or loss.clip,
            dual_clip=loss.dual_clip,
            loss_agg_mode=loss.loss_agg_mode,
            entropy_coef=loss.entropy_coef,
            kl_loss_coef=self.kl.loss_coef if self.needs_reference else 0.0,
            kl_penalty=self.kl.penalty,
            ratio_type=loss.ratio_type,
        )

    def recompute_old_log_probs(self, num_mini_batches: int) -> bool:
        filters = bool(self.correction.filter_rules)  # they compare recomputed log-probs with the engine's
        return self.update.epochs > 1 or num_mini_batches > 1 or filters

    @model_validator(mode="after")
    def _check_agentic(self) -> AgenticConfig:
        managers = [m for m in (self.train_env_manager, self.val_env_manager) if m is not None]
        for manager in managers:
            missing = sorted(set(manager.tags) - set(self.custom_envs))
            if missing:
                raise ValueError(f"{manager.name}.tags {missing} are not in custom_envs ({sorted(self.custom_envs)})")
            kinds = {self.custom_envs[tag].env_manager_cls for tag in manager.tags}
            if len(kinds) > 1:
                raise ValueError(f"{manager.name}.tags mix env managers {sorted(kinds)}; use one per manager")
        size = self.train_env_manager.group_size
        if self.rollout.batch_size % size:
            raise ValueError(
                f"rollout.batch_size={self.rollout.batch_size} (rollout_batch_size) must be a multiple of "
                f"train_env_manager.group_size={size}"
            )
        estimator = self.advantage.estimator
        allowed = STEP_ESTIMATORS if self.layout == "step" else TRAJ_ESTIMATORS
        if estimator not in allowed:
            raise ValueError(
                f"advantage.estimator={estimator} does not fit {self.layout}-wise samples (env_manager_cls); "
                f"use one of {list(allowed)}"
            )
        if estimator == "gae" and self.critic is None:
            raise ValueError("advantage.estimator=gae needs a critic role (model_args.model_head: value)")
        if estimator in ("grpo", "gigpo") and size < 2:
            raise ValueError(f"advantage.estimator={estimator} compares a group's episodes: set group_size >= 2")
        if self.needs_reference and self.reference is None:
            raise ValueError("kl.use_loss is on (use_kl_loss) but no reference role is configured")
        return self
