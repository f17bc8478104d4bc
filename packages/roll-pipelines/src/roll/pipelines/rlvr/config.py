"""RLVR configuration: roles, reward domains, and the algorithm in sections (PPO, GRPO, REINFORCE++, RLOO, GSPO, DAPO).

Sections: ``rollout`` (what a step generates), ``update`` (how samples become optimizer steps), ``advantage``,
``kl``, ``policy_loss``, ``value_loss`` (the critic's), ``correction`` (rollout/training mismatch), ``dynamic_sampling``,
``overlong`` and ``validation``. ROLL's flat keys (``adv_estimator``, ``pg_clip``, ``rollout_batch_size``,
``dynamic_sampling: true``, ...) are accepted and moved into their sections by :data:`FLAT_KEYS`; a setting given
both flat and in its section is an error.

Workers get their own resolved settings (:meth:`RLVRConfig.actor_settings` and friends), never this config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

from roll.pipelines.config import (
    BaseConfig,
    RoleConfig,
    field_default,
    is_int,
    missing_reference,
    raw_section,
    raw_value,
)
from roll.pipelines.rlvr.opd import (
    OPD_FLAT_KEYS,
    OPDSection,
    TeacherConfig,
    check_opd_teachers,
    dense_coef,
    map_student_roles,
    split_teacher_dict,
    teacher_settings,
    teachers_of,
)
from roll.pipelines.rlvr.sections import (
    AdvantageSection,
    AsyncSection,
    CorrectionSection,
    DynamicSamplingSection,
    KLSection,
    OverlongSection,
    PolicyLossSection,
    RewardConfig,
    RolloutSection,
    SampleMaskSection,
    UpdateSection,
    ValidationSection,
    ValueLossSection,
)
from roll.pipelines.rlvr.settings import ActorSettings, CriticSettings, PolicySettings
from roll.pipelines.rlvr.teacher_routing import check_teacher_routing
from roll.pipelines.rollout_mock import RolloutMockConfig, check_replay_supported
from roll.strategies import GenerationConfig

__all__ = ["FLAT_KEYS", "RLVRConfig", "fill_reward_tags", "sync_max_new_tokens"]


# ROLL-style flat key -> its section path. Data: a later ROLL-YAML importer extends this table.
FLAT_KEYS: dict[str, str] = {
    "rollout_batch_size": "rollout.batch_size",
    "prompt_length": "rollout.prompt_length",
    "response_length": "rollout.response_length",
    "domain_interleave_probs": "rollout.domain_interleave_probs",
    "model_update_frequency": "rollout.model_update_frequency",
    "rollout_dump": "rollout.dump",
    "ppo_epochs": "update.epochs",
    "ppo_mini_batch_size": "update.mini_batch_size",
    "critic_warmup": "update.critic_warmup",
    "adv_estimator": "advantage.estimator",
    "gamma": "advantage.gamma",
    "lambd": "advantage.lam",
    "norm_std": "advantage.norm_std",
    "reward_norm": "advantage.reward_norm",
    "reward_clip": "advantage.reward_clip",
    "whiten_advantages": "advantage.whiten",
    "whiten_rewards": "advantage.whiten_rewards",
    "advantage_clip": "advantage.clip",
    "kl_penalty": "kl.penalty",
    "add_token_level_kl": "kl.in_reward",
    "use_kl_loss": "kl.use_loss",
    "init_kl_coef": "kl.init_coef",
    "kl_ctrl_type": "kl.ctrl_type",
    "target_kl": "kl.target",
    "kl_horizon": "kl.horizon",
    "kl_loss_coef": "kl.loss_coef",
    "pg_clip": "policy_loss.clip",
    "pg_clip_low": "policy_loss.clip_low",
    "pg_clip_high": "policy_loss.clip_high",
    "dual_clip_loss": "policy_loss.dual_clip",
    "importance_sampling": "policy_loss.importance_sampling",
    "loss_agg_mode": "policy_loss.loss_agg_mode",
    "entropy_loss_coef": "policy_loss.entropy_coef",
    "pg_variant": "policy_loss.variant",
    "difficulty_loss_weight": "policy_loss.difficulty_loss_weight",
    "length_loss_weight": "policy_loss.length_loss_weight",
    "topr_positive_weight": "policy_loss.topr_positive_weight",
    "topr_negative_weight": "policy_loss.topr_negative_weight",
    "rl_loss_coef": "policy_loss.rl_loss_coef",
    "postive_loss_coef": "policy_loss.positive_loss_coef",
    "use_topr_neg_loss_coef": "policy_loss.topr_negative_loss_coef",
    "value_clip": "value_loss.clip",
    "tis_cap": "correction.tis_cap",
    "tis_level": "correction.tis_level",
    "tis_mode": "correction.tis_mode",
    "enable_old_logprobs_recompute": "correction.old_log_probs_recompute",
    "dynamic_sampling": "dynamic_sampling.enabled",
    "max_num_gen_batches": "dynamic_sampling.max_generation_rounds",
    "mask_truncated": "overlong.mask_truncated",
    "overlong_buffer_len": "overlong.buffer_len",
    "overlong_penalty_factor": "overlong.penalty_factor",
    "val_batch_size": "validation.batch_size",
    "val_generating_args": "validation.generating_args",
    "norm_mean_type": "advantage.norm_mean_type",
    "norm_std_type": "advantage.norm_std_type",
    "difficulty_mask": "sample_mask.difficulty",
    "difficulty_low_threshold": "sample_mask.difficulty_low",
    "difficulty_high_threshold": "sample_mask.difficulty_high",
    "error_max_len_clip": "sample_mask.error_max_len_clip",
    "error_max_len_threshold": "sample_mask.error_max_len_threshold",
    "async_generation_ratio": "asynchrony.generation_ratio",
    **OPD_FLAT_KEYS,
}


# --- derived values, filled into raw data before validation -------------------------------------------------
def fill_reward_tags(data: dict[str, Any]) -> None:
    """A reward domain without ``tag_included`` scores the samples tagged with its own name."""
    rewards = raw_section(data, "rewards")
    for domain in list(rewards or {}):
        reward = raw_section(rewards, domain)  # type: ignore[arg-type]
        if reward is not None and not reward.get("tag_included"):
            reward["tag_included"] = [domain]


def sync_max_new_tokens(data: dict[str, Any], role: str, response_length: Any) -> None:
    """``role.generating_args.max_new_tokens`` follows ``response_length``; setting both differently is an error."""
    if not is_int(response_length) or raw_section(data, role) is None:
        return
    generation = raw_section(data, role, "generating_args", create=True)
    if generation is None:
        return
    given = generation.get("max_new_tokens")
    if given is not None and given != response_length:
        raise ValueError(
            f"rollout.response_length={response_length} contradicts {role}.generating_args.max_new_tokens={given}; "
            f"set only one of them"
        )
    generation["max_new_tokens"] = response_length


class RLVRConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "rlvr"
    # --- roles ------------------------------------------------------------------------------------------
    actor_train: RoleConfig = Field(description="The trained policy (e.g. fsdp2_train); its data_args hold prompts.")
    actor_infer: RoleConfig = Field(description="The rollout engine (e.g. vllm); generating_args set sampling.")
    reference: RoleConfig | None = Field(
        default=None, description="Frozen reference policy; only created when KL is on."
    )
    critic: RoleConfig | None = Field(default=None, description="Value model; required by advantage.estimator=gae.")
    rewards: dict[str, RewardConfig] = Field(description="Reward domains: {math: {...}, code: {...}}.")
    teacher: TeacherConfig | None = Field(default=None, description="On-policy distillation's teacher (see opd).")
    teachers: dict[str, TeacherConfig] | None = Field(
        default=None,
        description="Several OPD teachers, each its own role, routed by tag_included (ROLL: a dict under teacher).",
    )
    # --- algorithm --------------------------------------------------------------------------------------
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    update: UpdateSection = Field(default_factory=UpdateSection)
    advantage: AdvantageSection = Field(default_factory=AdvantageSection)
    kl: KLSection = Field(default_factory=KLSection)
    policy_loss: PolicyLossSection = Field(default_factory=PolicyLossSection)
    value_loss: ValueLossSection = Field(default_factory=ValueLossSection)
    correction: CorrectionSection = Field(default_factory=CorrectionSection)
    dynamic_sampling: DynamicSamplingSection = Field(default_factory=DynamicSamplingSection)
    overlong: OverlongSection = Field(default_factory=OverlongSection)
    sample_mask: SampleMaskSection = Field(default_factory=SampleMaskSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    asynchrony: AsyncSection = Field(default_factory=AsyncSection)
    rollout_mock: RolloutMockConfig = Field(
        default_factory=RolloutMockConfig, description="ROLL's rollout dump/replay of training batches."
    )
    opd: OPDSection = Field(default_factory=OPDSection)

    @classmethod
    def normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Flat keys, ROLL's pure-OPD role names (student_train, student_infer) as actor_train, actor_infer, and
        ROLL's multi-teacher dict under ``teacher`` as ``teachers``."""
        data = super().normalize(data)
        map_student_roles(data)
        split_teacher_dict(data)
        return data

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Reward tags, the rollout budget of ``actor_infer``, and LR schedules that count every update."""
        data = super().derive_defaults(data)
        fill_reward_tags(data)
        response_length = raw_value(
            data, "rollout", "response_length", default=field_default(RolloutSection, "response_length")
        )
        sync_max_new_tokens(data, "actor_infer", response_length)
        prompts = raw_value(data, "rollout", "batch_size", default=field_default(RolloutSection, "batch_size"))
        n = raw_value(
            data,
            "actor_infer",
            "generating_args",
            "num_return_sequences",
            default=field_default(GenerationConfig, "num_return_sequences"),
        )
        mini = raw_value(data, "update", "mini_batch_size")
        epochs = raw_value(data, "update", "epochs", default=field_default(UpdateSection, "epochs"))
        if all(is_int(v) and v > 0 for v in (prompts, n, epochs)) and (mini is None or (is_int(mini) and mini > 0)):
            samples = prompts * n
            updates = epochs * -(-samples // (mini or samples))
            for role in ("actor_train", "critic"):
                cls.fill_schedule_length(data, role, updates)
        return data

    @property
    def group_size(self) -> int:
        return self.actor_infer.generating_args.num_return_sequences

    @property
    def needs_reference(self) -> bool:
        return self.kl.needs_reference

    def teacher_roles(self) -> dict[str, TeacherConfig]:
        """The OPD teachers by name: ``teachers``, or ``{"teacher": teacher}`` for the single one."""
        return teachers_of(self.teacher, self.teachers)

    def recompute_old_log_probs(self, num_mini_batches: int) -> bool:
        """Whether a step with this many mini-batches needs actor_train's log-probs before it trains."""
        setting = self.correction.old_log_probs_recompute
        if setting != "auto":
            return setting
        off_policy = self.update.epochs > 1 or num_mini_batches > 1
        correction = self.correction
        needs_them_first = correction.tis_cap is not None or bool(correction.filter_rules) or self.kl.in_reward_on
        return off_policy or needs_them_first

    # --- what each worker is told ---------------------------------------------------------------------------
    @property
    def sampling_temperature(self) -> float:
        """The temperature rollouts are sampled at (greedy counts as 1): log-probs are taken at it."""
        temperature = self.actor_infer.generating_args.temperature
        return temperature if temperature > 0 else 1.0

    def policy_settings(self) -> PolicySettings:
        return PolicySettings(temperature=self.sampling_temperature)

    def teacher_settings(self) -> PolicySettings:
        """An OPD teacher: log-probs of the samples and, for dense OPD, its top-k (or whole) distributions."""
        return teacher_settings(self.opd, self.sampling_temperature)

    def reference_settings(self) -> PolicySettings:
        """The reference also returns whole distributions when the KL is 'full'."""
        full = self.kl.penalty == "full" or self.kl.full_loss
        return PolicySettings(temperature=self.sampling_temperature, full_distribution=full)

    def actor_settings(self) -> ActorSettings:
        loss = self.policy_loss
        return ActorSettings(
            temperature=self.sampling_temperature,
            clip_low=loss.clip_low or loss.clip,
            clip_high=loss.clip_high or loss.clip,
            dual_clip=loss.dual_clip,
            importance_sampling=loss.importance_sampling,
            loss_agg_mode=loss.loss_agg_mode,
            entropy_coef=loss.entropy_coef,
            kl_loss_coef=self.kl.loss_coef if self.kl.loss_on else 0.0,
            kl_penalty=self.kl.loss_estimator,
            full_distribution=self.kl.penalty == "full" and self.kl.in_reward_on,
            pg_variant=loss.variant,
            difficulty_loss_weight=loss.difficulty_loss_weight,
            length_loss_weight=loss.length_loss_weight,
            pg_params=loss.pg_params(),
            rl_loss_coef=loss.rl_loss_coef,
            positive_loss_coef=loss.positive_loss_coef,
            topr_negative_loss_coef=loss.topr_negative_loss_coef,
            opd_dense_objective=self.opd.dense_objective,
            opd_dense_coef=dense_coef(self.opd, self.teacher_roles()),
        )

    def critic_settings(self) -> CriticSettings:
        return CriticSettings(value_clip=self.value_loss.clip)

    @model_validator(mode="after")
    def _check_rlvr(self) -> RLVRConfig:
        if self.actor_train.data_args is None:
            raise ValueError("actor_train.data_args is required: file_name with prompts (and eval_file_name)")
        if not self.rewards:
            raise ValueError("rewards needs at least one domain, e.g. rewards: {math: {reward_type: math}}")
        if self.needs_reference and self.reference is None:
            raise missing_reference("KL is on (kl.in_reward or kl.use_loss)")
        estimator = self.advantage.estimator
        if self.advantage.whiten_rewards and estimator in ("rloo", "reinforce_plus_plus_baseline"):
            raise ValueError(
                f"advantage.whiten_rewards (ROLL's) applies to gae, reinforce, reinforce_plus_plus and grpo, "
                f"not to advantage.estimator={estimator}"
            )
        if self.kl.penalty == "full" and self.kl.in_reward_on and self.correction.old_log_probs_recompute is False:
            raise ValueError(
                "kl.penalty=full in the reward needs the old policy's whole distributions: leave "
                "correction.old_log_probs_recompute at 'auto' or true"
            )
        if estimator == "gae" and self.critic is None:
            raise ValueError("advantage.estimator=gae needs a critic role (model_args.model_head: value)")
        teachers = check_opd_teachers(self.opd, self.teacher, self.teachers)
        if self.opd.on:
            check_teacher_routing(
                {domain: reward.tag_included for domain, reward in self.rewards.items()},
                {name: role.tag_included for name, role in teachers.items()},
                pure=self.opd.pure,
            )
        if self.opd.pure and self.dynamic_sampling.enabled:
            raise ValueError("is_pure_opd does not score training rollouts: turn dynamic_sampling off")
        pure = self.opd.pure
        if not pure and estimator in ("grpo", "rloo", "reinforce_plus_plus_baseline") and self.group_size < 2:
            raise ValueError(
                f"advantage.estimator={estimator} compares samples of one prompt: set "
                f"actor_infer.generating_args.num_return_sequences >= 2"
            )
        check_replay_supported(self.rollout_mock, asynchronous=self.asynchrony.enabled)
        probs = self.rollout.domain_interleave_probs
        unknown = sorted(set(probs or {}) - set(self.rewards))
        if unknown:
            raise ValueError(
                f"rollout.domain_interleave_probs names {unknown}, which are not reward domains {sorted(self.rewards)}"
            )
        return self
