"""The agentic pipeline's configuration: roles, envs (ROLL's keys), and the algorithm in sections.

Roles: ``actor_train`` (trained policy), ``actor_infer`` (rollout engine), optional ``reference`` (KL) and
``critic`` (GAE). Envs: ``custom_envs`` and the ``train_env_manager`` / ``val_env_manager`` EnvironmentWorker
roles of :mod:`roll.agentic.config`. Sections: ``rollout``, ``update``, ``advantage``, ``policy_loss``, ``kl``,
``value_loss`` (the critic's, RLVR's section) and ``warmup`` (behaviour cloning of a scripted expert before RL). ROLL's flat keys (``rollout_batch_size``,
``adv_estimator``, ``episode_reward_weight``, ``ratio_type``, ...) are moved into their sections by
:data:`FLAT_KEYS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from roll.agentic.config import (
    ENV_MANAGER_ALIASES,
    GROUPING_ALIASES,
    GROUPING_COLUMNS,
    PARSE_TOOL_CALL_DESCRIPTION,
    STEP_GROUPING_COLUMNS,
    CustomEnvConfig,
    EnvManagerConfig,
    RewardNormalizationConfig,
    is_step_manager,
    spread_parse_tool_call,
    spread_system_envs,
)
from roll.pipelines.algorithms.train_infer import RatioDiffFilter
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
from roll.pipelines.rlvr.sections import KLSection as RlvrKLSection
from roll.pipelines.rlvr.sections import TrainInferFilterConfig, ValueLossSection
from roll.pipelines.rlvr.settings import CriticSettings, PolicySettings
from roll.pipelines.rlvr.teacher_routing import check_teacher_routing
from roll.pipelines.rollout_mock import RolloutMockConfig, check_replay_supported
from roll.runtime import RollModel
from roll.strategies import TrainingArgs
from roll.strategies.registry import STRATEGIES, sets_learning_rate_mid_run, strategies_with

if TYPE_CHECKING:
    from roll.agentic.driver_envs import DriverEnvs

logger = logging.getLogger(__name__)

__all__ = [
    "FLAT_KEYS",
    "STEP_ESTIMATORS",
    "TRAJ_ESTIMATORS",
    "VAL_SEED_OFFSET",
    "AgenticAdvantageSection",
    "AgenticAsyncSection",
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
    "async_generation_ratio": "asynchrony.generation_ratio",
    "ppo_epochs": "update.epochs",
    "ppo_mini_batch_size": "update.mini_batch_size",
    "batch_adjust_mode": "update.batch_adjust_mode",
    "critic_warmup": "update.critic_warmup",
    "value_clip": "value_loss.clip",
    "adv_estimator": "advantage.estimator",
    "gamma": "advantage.gamma",
    "lambd": "advantage.lam",
    "episode_reward_weight": "advantage.episode_reward_weight",
    "step_reward_weight": "advantage.step_reward_weight",
    "step_reward_gamma": "advantage.step_reward_gamma",
    "whiten_advantages": "advantage.whiten",
    "whiten_rewards": "advantage.whiten_rewards",
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
    "add_token_level_kl": "kl.in_reward",
    "init_kl_coef": "kl.init_coef",
    "kl_ctrl_type": "kl.ctrl_type",
    "target_kl": "kl.target",
    "kl_horizon": "kl.horizon",
    **OPD_FLAT_KEYS,
}

Estimator = Literal["grpo", "reinforce", "gae", "gigpo", "step_reinforce", "agentic_reinforce"]
TRAJ_ESTIMATORS = ("grpo", "reinforce", "gae", "agentic_reinforce")
"""Estimators for trajectory-wise samples (one row per episode)."""
STEP_ESTIMATORS = ("grpo", "reinforce", "gigpo", "step_reinforce")
"""Estimators for step-wise samples (one row per turn)."""
VAL_SEED_OFFSET = 7_919
"""The validation scheduler's base seed is ``seed + VAL_SEED_OFFSET`` (held-out seeds, not the training ones)."""


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
    max_faulted_steps: int | None = Field(
        default=3,
        ge=0,
        description="Stop the run after this many steps in a row that env faults left with nothing to train (every "
        "group dropped: envs raising, hanging past step_timeout_s, dead tools; with asynchrony.generation_ratio, a "
        "step whose groups x max_launch_factor rounds were dropped in a row); 0 or null: never stop.",
    )


class AgenticAsyncSection(RollModel):
    """Asynchronous rollouts (ROLL's ``async_generation_ratio``): env groups keep playing while the actor trains.

    Generation runs at most ``generation_ratio`` steps ahead of training; a trajectory trained on at step ``k`` was
    generated by a policy of version ``>= k - 1 - ceil(ratio)`` (older groups are dropped and replaced); weights
    are synced at step boundaries, with generation paused. 0 or None: the synchronous step.
    """

    generation_ratio: float | None = Field(
        default=None,
        ge=0,
        description="async_generation_ratio: steps generation may run ahead of training; trajectories are at most "
        "ceil(ratio) policy versions stale (0/None: synchronous).",
    )
    take_timeout_s: float | None = Field(
        default=None, gt=0, description="Fail a step that waits longer than this for its trajectories (None: wait)."
    )

    @property
    def enabled(self) -> bool:
        return bool(self.generation_ratio)

    @model_validator(mode="after")
    def _warn_unused_timeout(self) -> AgenticAsyncSection:
        if self.take_timeout_s is not None and not self.enabled:
            logger.warning(
                "asynchrony.take_timeout_s=%g is ignored: it bounds the wait for asynchronous rollouts, and "
                "asynchrony.generation_ratio (async_generation_ratio) is %s, so steps play their episodes themselves "
                "(custom_envs.<tag>.step_timeout_s bounds each env call)",
                self.take_timeout_s,
                self.generation_ratio,
            )
        return self


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
    whiten_rewards: bool = Field(
        default=False,
        description="ROLL's whiten_rewards: whiten the token rewards (after reward_clip and the in-reward KL) over "
        "the batch's response tokens before the estimator (grpo, reinforce, gigpo, step_reinforce, gae).",
    )
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
    equal_episode_weights: bool = Field(
        default=False,
        description="Every episode weighs the same in the policy-gradient term, however many rows it has: each row "
        "of an episode with n rows is weighted rows / (episodes * n). For step-wise rows (one per turn), where long "
        "episodes would otherwise weigh more; trajectory-wise rows are one per episode and keep weight 1.",
    )


KLKind = Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"]  # RLVR's but 'full' (sampled tokens only)


class KLSection(RlvrKLSection):
    """RLVR's KL section (a loss term ``use_loss`` and/or a per-token reward penalty ``in_reward``, ROLL's
    ``add_token_level_kl``; either needs a reference role), with the agentic pipeline's estimators (no exact 'full'
    KL: its workers score the sampled tokens only) and ROLL's agentic ``init_kl_coef`` default."""

    penalty: KLKind = Field(default="k3", description="Per-token KL estimator (ROLL's kl_penalty).")
    loss_penalty: KLKind | None = Field(
        default=None,
        description="Estimator of the KL loss term (None: penalty). ROLL's agentic actor always uses k3 for it, "
        "whatever kl_penalty says, so ROLL files set k3.",
    )
    init_coef: float = Field(
        default=0.2, ge=0, description="init_kl_coef: the reward penalty's coefficient (its start if adaptive)."
    )


class WarmupSection(RollModel):
    """Behaviour cloning before RL: episodes of a scripted policy (e.g. a noisy planner) as SFT targets."""

    steps: int = Field(default=0, ge=0, description="Warm-up optimizer steps (0: none).")
    episodes_per_step: int = Field(default=32, ge=1, description="Expert episodes per warm-up step.")
    policy: str = Field(
        default="roll.agentic.policy.expert:FrozenLakeExpert", description="'module:Class' of a text policy."
    )
    policy_kwargs: dict[str, Any] = Field(default_factory=dict, description="e.g. {noise: 0.5}.")
    group_size: int = Field(
        default=1,
        ge=1,
        description="Episodes per layout (env seed) in the warm-up: the training envs regrouped into groups of this "
        "size (a divisor of train_env_manager.group_size). A noise-free planner plays the same episode on every copy "
        "of a layout, so 1 clones group_size times more layouts in the same time; RL keeps its groups.",
    )
    seed: int = Field(default=1_000_003, description="Base seed of the warm-up episodes (not the RL seeds).")
    num_mini_batches: int = Field(
        default=1,
        ge=1,
        description="Optimizer steps per warm-up step: its episodes' rows split into this many shuffled mini-batches.",
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        description="The warm-up's learning rate (None: actor_train.training_args.learning_rate, which RL uses after "
        "it). Adam's moments carry over. Needs a strategy that can change its rate (fsdp2_train).",
    )
    reference: Literal["warmed", "model"] = Field(
        default="warmed",
        description="With a reference role (kl.use_loss): 'warmed' gives it actor_train's weights after the warm-up, "
        "so the KL term anchors RL on the warmed-up policy (as RLHF anchors on its SFT model); 'model' keeps the "
        "reference on its own model_args weights.",
    )
    cache: bool = Field(
        default=False,
        description="Keep the trained warm-up (actor_train's weights, optimizer and schedule) under "
        "$ROLL_CACHE_DIR/agentic-warmup/, keyed by everything that shapes it (this section, the training envs, "
        "actor_train's model files, training and strategy args, the packages' versions), and reuse it in later runs.",
    )


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


def _raw_layout(data: dict[str, Any]) -> str | None:
    """``step`` or ``traj`` (as :attr:`AgenticConfig.layout`) from raw data, None where it is not readable yet."""
    tags = raw_value(data, "train_env_manager", "tags", default=None)
    envs = data.get("custom_envs")
    if not isinstance(tags, list) or not isinstance(envs, dict) or not tags:
        return None
    specs = [envs.get(tag) for tag in tags]
    managers = [spec.get("env_manager_cls", "traj") for spec in specs if isinstance(spec, dict)]
    if len(managers) != len(specs) or not all(isinstance(m, str) for m in managers):
        return None
    return _layout_of(managers)


def _layout_of(managers: Iterable[str]) -> str:
    """``step`` when every env manager lays samples out step-wise, else ``traj``."""
    return "step" if all(is_step_manager(m) for m in managers) else "traj"


def _decays(training: dict[str, Any]) -> bool:
    """Whether raw ``training_args`` set a learning rate that follows ``max_steps`` (False where they are invalid:
    validation reports them)."""
    try:
        return TrainingArgs.model_validate(training).schedule_uses_max_steps
    except ValueError:
        return False


class AgenticConfig(BaseConfig):
    flat_keys: ClassVar[Mapping[str, str]] = FLAT_KEYS

    pipeline_cls: str = "agentic"
    actor_train: RoleConfig = Field(description="The trained policy (e.g. fsdp2_train).")
    actor_infer: RoleConfig = Field(description="The rollout engine (hf_infer, vllm); generating_args per turn.")
    reference: RoleConfig | None = Field(default=None, description="Frozen reference; created when kl.use_loss.")
    critic: RoleConfig | None = Field(default=None, description="Value model; required by estimator gae.")
    teacher: TeacherConfig | None = Field(default=None, description="On-policy distillation's teacher (see opd).")
    teachers: dict[str, TeacherConfig] | None = Field(
        default=None,
        description="Several OPD teachers, each its own role, routed by env tag: a teacher scores the rows of the env "
        "tags in its tag_included (empty: every row). ROLL: a dict under teacher.",
    )
    custom_envs: dict[str, CustomEnvConfig] = Field(description="Env tags: {FrozenLake: {env_type: frozen_lake}}.")
    train_env_manager: EnvManagerConfig = Field(description="Training env groups (num_env_groups, group_size, tags).")
    val_env_manager: EnvManagerConfig | None = Field(default=None, description="Held-out validation env groups.")
    reward_normalization: RewardNormalizationConfig = Field(default_factory=RewardNormalizationConfig)
    rollout: AgenticRolloutSection = Field(default_factory=AgenticRolloutSection)
    asynchrony: AgenticAsyncSection = Field(default_factory=AgenticAsyncSection)
    rollout_mock: RolloutMockConfig = Field(
        default_factory=RolloutMockConfig, description="ROLL's rollout dump/replay of training batches."
    )
    update: UpdateSection = Field(default_factory=UpdateSection)
    advantage: AgenticAdvantageSection = Field(default_factory=AgenticAdvantageSection)
    policy_loss: AgenticPolicyLossSection = Field(default_factory=AgenticPolicyLossSection)
    kl: KLSection = Field(default_factory=KLSection)
    value_loss: ValueLossSection = Field(default_factory=ValueLossSection, description="The critic's (gae).")
    warmup: WarmupSection = Field(default_factory=WarmupSection)
    correction: AgenticCorrectionSection = Field(default_factory=AgenticCorrectionSection)
    opd: OPDSection = Field(
        default_factory=OPDSection,
        description="On-policy distillation (ROLL's is_pure_opd / use_opd, agentic): the teachers score the episodes' "
        "assistant tokens and -opd_kl_coef x KL(student || teacher) per token is the advantage (pure) or is added to "
        "the estimator's (mixed).",
    )
    max_rl_time_s: float | None = Field(
        default=None, gt=0, description="Stop RL once this much wall time has passed (then validate); None: no limit."
    )
    parse_tool_call_parameter_to_dict: bool = Field(default=False, description=PARSE_TOOL_CALL_DESCRIPTION)

    def deployment_checks(self) -> list[Callable[[], str | None]]:
        """``roll validate``: each env entry's type, env_config and tools (nothing built), and a random-action env for
        each tag of a manager with ``llm_proxy.proxy_type: random``; the ROCK envs' SDK, agent config, task file and
        service; ``rollout.sequence_length`` against each env tag's first prompt and the models' positions
        (:meth:`length_checks`)."""
        from roll.agentic.driver_envs import DriverEnvs
        from roll.agentic.env.rock.checks import rock_checks
        from roll.agentic.pool import env_checks

        envs = DriverEnvs()  # a tag's env is built once for the random-action and first-prompt checks
        return [
            *env_checks(self.custom_envs, self.env_managers(), envs),
            *rock_checks(self.custom_envs),
            *self.length_checks(envs=envs),
            envs.close,
        ]

    def env_managers(self) -> list[EnvManagerConfig]:
        """The train env manager, and the val one where set."""
        return [m for m in (self.train_env_manager, self.val_env_manager) if m is not None]

    def length_checks(self, tokenizer: Any = None, envs: DriverEnvs | None = None) -> list[Callable[[], str | None]]:
        """``rollout.sequence_length`` against the first prompt of each train and val env tag and against the models'
        positions (:mod:`roll.agentic.pipeline.lengths`); ``tokenizer``: the pipeline's (else actor_train's is
        loaded where it can be read here); ``envs``: the driver's envs, shared with the random-action checks."""
        from roll.agentic.pipeline.lengths import length_checks

        managers = [("train_env_manager", self.train_env_manager, self.seed, "train")]
        if self.val_env_manager is not None:
            managers.append(("val_env_manager", self.val_env_manager, self.seed + VAL_SEED_OFFSET, "val"))
        return length_checks(self, managers, tokenizer_role="actor_train", tokenizer=tokenizer, envs=envs)

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
        """Manager names and system_envs, GRPO's and GiGPO's default grouping, and the actor's LR schedule length (RL + warm-up)."""
        data = spread_system_envs(super().derive_defaults(data))
        spread_parse_tool_call(data)
        for key, name in (("train_env_manager", "train_env"), ("val_env_manager", "val_env")):
            section = raw_section(data, key)
            if section is not None and section.get("name") in (None, "worker"):
                section["name"] = name
        estimator = raw_value(data, "advantage", "estimator", default="grpo")
        if estimator in ("grpo", "gigpo"):
            cls._fill_group_normalization(data)
        cls._fill_schedule_length(data)
        return data

    @staticmethod
    def _fill_group_normalization(data: dict[str, Any]) -> None:
        """GRPO's and GiGPO's ``reward_normalization``: mean/std within ``traj_group_id`` (the episodes sharing a
        seed), for whatever the section leaves out; a section giving only ``method`` (e.g. an override
        ``reward_normalization.method=mean``) keeps the episode groups instead of falling back to the whole batch.
        (ROLL's files get ROLL's field defaults written in by the compat layer before this.)"""
        if raw_value(data, "reward_normalization") is None:
            data["reward_normalization"] = {}
        section = raw_section(data, "reward_normalization")
        if section is None:
            return  # not a mapping: validation names it
        section.setdefault("grouping", "traj_group_id")
        if "norm_mean_type" not in section and "norm_std_type" not in section:
            section.setdefault("method", "mean_std")

    @classmethod
    def _fill_schedule_length(cls, data: dict[str, Any]) -> None:
        """actor_train's and the critic's LR schedule lengths, unless set: RL's optimizer steps (plus the warm-up's for
        actor_train; the critic trains in every RL step with actor_train's plan). An RL step takes ``epochs`` x its
        mini-batches; with ``update.mini_batch_size`` a trajectory-wise step has ceil(rollout.batch_size /
        mini_batch_size) of them, a step-wise one a number that follows the episodes' turns, so a schedule that
        decays over a count it cannot know is refused."""
        epochs = raw_value(data, "update", "epochs", default=1)
        mini_batch = raw_value(data, "update", "mini_batch_size", default=None)
        rows = raw_value(
            data, "rollout", "batch_size", default=AgenticRolloutSection.model_fields["batch_size"].default
        )
        warmup = raw_value(data, "warmup", "steps", default=0)
        warmup_updates = raw_value(data, "warmup", "num_mini_batches", default=1)
        max_steps = data.get("max_steps", field_default(cls, "max_steps"))
        if not all(is_int(v) for v in (epochs, warmup, warmup_updates, max_steps, rows)):
            return  # validation reports the bad value
        layout = _raw_layout(data)
        for role, extra in (("actor_train", warmup * warmup_updates), ("critic", 0)):
            training = raw_section(data, role, "training_args", create=True) if data.get(role) else None
            if training is None or training.get("max_steps") is not None:
                continue
            per_step = 1
            if is_int(mini_batch) and mini_batch > 0:
                if layout == "step" and _decays(training):
                    raise ValueError(
                        "update.mini_batch_size (ppo_mini_batch_size) on step-wise rows makes each RL step's "
                        "optimizer steps follow the episodes' turns, so the learning-rate schedule cannot be sized "
                        f"for you: set {role}.training_args.max_steps (the optimizer steps of the whole run), or use "
                        "a constant schedule"
                    )
                if layout == "traj":
                    per_step = -(-rows // mini_batch)
            training["max_steps"] = max_steps * epochs * per_step + extra

    # --- derived views ------------------------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """``traj`` or ``step``: the sample layout of the training manager's envs."""
        return _layout_of(self.custom_envs[tag].env_manager_cls for tag in self.train_env_manager.tags)

    @property
    def sampling_temperature(self) -> float:
        """The temperature the training turns are sampled at (the training manager's ``generating_args``, else
        actor_infer's): the loss's, the old policy's and the reference's log-probs are taken at it, as the rollout
        engine's are (a validation manager's own sampling does not reach training)."""
        temperature = self.train_env_manager.turn_generation(self.actor_infer.generating_args).temperature
        return temperature if temperature > 0 else 1.0

    @property
    def needs_reference(self) -> bool:
        return self.kl.loss_on or self.kl.in_reward_on

    def policy_settings(self) -> PolicySettings:
        return PolicySettings(temperature=self.sampling_temperature)

    def teacher_roles(self) -> dict[str, TeacherConfig]:
        """The OPD teachers by name: ``teachers``, or ``{"teacher": teacher}`` for the single one."""
        return teachers_of(self.teacher, self.teachers)

    def teacher_settings(self) -> PolicySettings:
        """An OPD teacher: log-probs of the episodes' tokens and, for dense OPD, its top-k (or whole) distributions."""
        return teacher_settings(self.opd, self.sampling_temperature)

    def env_tag_domains(self) -> dict[str, list[str]]:
        """Each env tag as its own routing domain (ROLL's agentic OPD): an episode goes to the teachers whose
        ``tag_included`` has its env tag, or that have none."""
        return {tag: [tag] for tag in self.custom_envs}

    def critic_settings(self) -> CriticSettings:
        return CriticSettings(value_clip=self.value_loss.clip)

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
            kl_loss_coef=self.kl.loss_coef if self.kl.loss_on else 0.0,
            kl_penalty=self.kl.loss_estimator,
            ratio_type=loss.ratio_type,
            opd_dense_objective=self.opd.dense_objective,
            opd_dense_coef=dense_coef(self.opd, self.teacher_roles()),
        )

    def recompute_old_log_probs(self, num_mini_batches: int) -> bool:
        filters = bool(self.correction.filter_rules)  # they compare recomputed log-probs with the engine's
        return self.update.epochs > 1 or num_mini_batches > 1 or filters

    def _check_grpo_of_one(self) -> None:
        """GRPO with groups of one episode, as ROLL runs it: its agentic ``grpo`` is REINFORCE on rewards normalized by
        ``reward_normalization`` (ROLL's agentic_reward_norm), meaningful unless the statistics are per episode
        group: one score against its own mean/std is 0 (ROLL sets it to 0 too), so every advantage would be 0."""
        norm = self.reward_normalization
        if norm.grouping == "traj_group_id" and "group" in (norm.norm_mean_type, norm.norm_std_type):
            raise ValueError(
                "advantage.estimator=grpo with train_env_manager.group_size=1 and reward_normalization grouped by "
                "traj_group_id (the default for grpo) normalizes each episode against itself: every advantage is 0. "
                "Set group_size >= 2, or reward_normalization.grouping to batch or tags"
            )
        logger.warning(
            "advantage.estimator=grpo with group_size=1: no within-group baseline; advantages are the episode scores "
            "normalized over reward_normalization.grouping=%s (method %s), as ROLL does",
            norm.grouping,
            norm.method,
        )

    def _check_grouping(self) -> None:
        """``reward_normalization.grouping`` names a column the training samples have: a misspelt one used to pass and
        fail the first step's advantages, after every worker had started and the first rollout was played. gae and
        agentic_reinforce do not normalize; managers of one's own (an import path) may write other columns."""
        grouping = self.reward_normalization.grouping
        managers = {self.custom_envs[tag].env_manager_cls for tag in self.train_env_manager.tags}
        normalizes = self.advantage.estimator not in ("gae", "agentic_reinforce")
        if grouping == "batch" or not normalizes or not managers <= set(ENV_MANAGER_ALIASES.values()):
            return
        columns = [*GROUPING_COLUMNS, *(STEP_GROUPING_COLUMNS if self.layout == "step" else ())]
        if grouping not in columns:
            roll_names = {ours: theirs for theirs, ours in GROUPING_ALIASES.items()}
            named = [f"{c} (ROLL: {roll_names[c]})" if c in roll_names else c for c in columns]
            raise ValueError(
                f"reward_normalization.grouping={grouping!r} is not a column of the {self.layout}-wise samples: use "
                f"batch (one group) or one of {', '.join(named)}"
            )

    def _check_opd(self) -> None:
        """Teachers and OPD go together; each teacher's tags are env tags; in pure OPD every training env tag has a
        teacher (its episodes would get no advantage otherwise) and nothing reward-based is configured (unused)."""
        teachers = check_opd_teachers(self.opd, self.teacher, self.teachers)
        if teachers and not self.opd.on:
            raise ValueError(
                f"teacher role(s) {sorted(teachers)} are set but on-policy distillation is off, so no teacher would "
                "run: set is_pure_opd (opd.pure) or use_opd (opd.mixed), or drop the teacher"
            )
        if not self.opd.on:
            return
        if self.opd.score_rollouts:
            raise ValueError(
                "opd.score_rollouts is RLVR's (its reward domains score pure-OPD rollouts for the metrics); the agentic "
                "pipeline always reports the env's reward and success of its episodes: drop it"
            )
        check_teacher_routing(
            self.env_tag_domains(),
            self.teacher_tags_of(),
            pure=self.opd.pure,
            unit="env tag",
            trained=self.train_env_manager.tags,
        )
        if not self.opd.pure:
            return
        if self.kl.in_reward_on:
            raise ValueError(
                "is_pure_opd with kl.in_reward (add_token_level_kl): pure OPD's advantage is the teachers' KL alone, "
                "so a reward penalty would be ignored; use use_opd (opd.mixed), or kl.use_loss for a KL term"
            )
        if self.critic is not None:
            raise ValueError(
                "is_pure_opd with a critic role: pure OPD trains on the teachers' KL, with no returns to fit; drop the "
                "critic, or use use_opd (opd.mixed) with advantage.estimator gae"
            )

    def teacher_tags_of(self) -> dict[str, list[str]]:
        """Teacher name -> its ``tag_included`` (empty: every env tag)."""
        return {name: list(role.tag_included) for name, role in self.teacher_roles().items()}

    def _check_warmup_learning_rate(self) -> None:
        strategy = getattr(self.actor_train.strategy_args, "strategy_name", None)
        if strategy is None or sets_learning_rate_mid_run(strategy):
            return
        able = [name for name in strategies_with("mid_run_learning_rate") if STRATEGIES.get(name).is_training]
        raise ValueError(
            f"warmup.learning_rate needs actor_train on a backend that can change its learning rate mid-run "
            f"({', '.join(able)}); it runs {strategy}. Drop warmup.learning_rate to warm up at "
            "training_args.learning_rate"
        )

    def warmup_env_manager(self) -> EnvManagerConfig:
        """The training envs regrouped for the warm-up: groups of ``warmup.group_size`` episodes on one layout, as
        many envs (no redundant ones), no group filter, as many EnvironmentWorkers as those envs fill."""
        manager = self.train_env_manager
        copies = manager.group_size // self.warmup.group_size
        envs = manager.num_env_groups * copies * self.warmup.group_size
        shape = {
            "group_size": self.warmup.group_size,
            "num_env_groups": manager.num_env_groups * copies,
            "num_groups_partition": [n * copies for n in manager.num_groups_partition or []] or None,
            "group_filter_cls": "roll.agentic.scheduler.filters.GroupFilter",
            "group_size_redundancy": 0,
            # the training manager's envs per worker count its redundant episodes, which the warm-up does not play
            "max_env_num_per_worker": min(manager.max_env_num_per_worker or envs, envs),
        }
        # validated again, so that EnvManagerConfig derives world_size from these envs as for any manager
        return EnvManagerConfig.model_validate({**manager.model_dump(), **shape})

    @model_validator(mode="after")
    def _check_agentic(self) -> AgenticConfig:
        managers = {"train_env_manager": self.train_env_manager, "val_env_manager": self.val_env_manager}
        for key, manager in managers.items():
            if manager is None:
                continue
            missing = sorted(set(manager.tags) - set(self.custom_envs))
            if missing:
                raise ValueError(
                    f"{key}.tags {missing} are not in custom_envs ({sorted(self.custom_envs)}): define them there or "
                    "fix the tag's spelling"
                )
            kinds = {self.custom_envs[tag].env_manager_cls for tag in manager.tags}
            if len(kinds) > 1:
                raise ValueError(f"{key}.tags mix env managers {sorted(kinds)}; use one per manager")
            manager.check_proxy_thinking(key, self.custom_envs)
        proxy = self.train_env_manager.llm_proxy.proxy_type
        if proxy != "policy":
            raise ValueError(
                f"train_env_manager.llm_proxy.proxy_type is {proxy}: the agentic pipeline trains on the policy's own "
                "samples; use proxy_type policy here (a val_env_manager may play openai or random as a baseline, and "
                "the agentic_rollout pipeline plays any proxy)"
            )
        size = self.train_env_manager.group_size
        self.train_env_manager.groups_for(
            self.rollout.batch_size, "rollout.batch_size (rollout_batch_size)", "train_env_manager"
        )
        if self.val_env_manager is not None:
            self.val_env_manager.groups_for(
                self.rollout.val_batch_size, "rollout.val_batch_size (val_batch_size)", "val_env_manager"
            )
        elif self.eval_steps or self.rollout.val_batch_size is not None:
            logger.warning(
                "eval_steps=%d, val_batch_size=%s, but there is no val_env_manager: this run never validates; add "
                "one (num_env_groups, group_size, tags) to validate on held-out envs",
                self.eval_steps,
                self.rollout.val_batch_size,
            )
        self._check_grouping()
        self._check_opd()
        estimator = self.advantage.estimator
        allowed = STEP_ESTIMATORS if self.layout == "step" else TRAJ_ESTIMATORS
        if estimator not in allowed:
            raise ValueError(
                f"advantage.estimator={estimator} does not fit {self.layout}-wise samples (env_manager_cls); "
                f"use one of {list(allowed)}"
            )
        if self.advantage.whiten_rewards and estimator == "agentic_reinforce":
            raise ValueError(
                "advantage.whiten_rewards (whiten_rewards) with advantage.estimator=agentic_reinforce: roll's "
                "agentic_reinforce sums each turn's token rewards, and whitened every token carries one, so a turn's "
                "return would count its length (ROLL reads the turn's last token); drop whiten_rewards or pick "
                "another estimator"
            )
        if estimator == "gae" and self.critic is None:
            raise ValueError("advantage.estimator=gae needs a critic role (model_args.model_head: value)")
        if estimator == "gigpo" and size < 2 and not self.opd.pure:
            raise ValueError(f"advantage.estimator={estimator} compares a group's episodes: set group_size >= 2")
        if estimator == "grpo" and size < 2 and not self.opd.pure:
            self._check_grpo_of_one()
        if self.warmup.steps and self.warmup.learning_rate is not None:
            self._check_warmup_learning_rate()
        if self.warmup.steps and size % self.warmup.group_size:
            raise ValueError(
                f"warmup.group_size={self.warmup.group_size} must divide train_env_manager.group_size={size} (the "
                "warm-up regroups the training envs); 1 gives every warm-up episode its own layout"
            )
        if self.needs_reference and self.reference is None:
            raise missing_reference("KL is on (kl.use_loss / use_kl_loss or kl.in_reward / add_token_level_kl)")
        check_replay_supported(self.rollout_mock, asynchronous=self.asynchrony.enabled)
        if self.asynchrony.enabled and self.rollout.model_update_frequency != 1:
            raise ValueError(
                "asynchrony.generation_ratio (async_generation_ratio) bounds staleness by weight syncs: it needs "
                f"rollout.model_update_frequency=1, got {self.rollout.model_update_frequency}"
            )
        if self.asynchrony.enabled and self.train_env_manager.max_traj_per_env > 0:
            logger.warning(
                "train_env_manager.max_traj_per_env=%d is ignored: asynchronous rollouts (async_generation_ratio) play "
                "rounds continuously, not per batch request, and asynchrony.generation_ratio bounds how far they run "
                "ahead; it caps a synchronous step's rounds per env group",
                self.train_env_manager.max_traj_per_env,
            )
        return self
