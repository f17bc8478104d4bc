"""The sections of the RLVR configuration (:class:`roll.pipelines.rlvr.config.RLVRConfig`): what a step generates,
how samples become optimizer steps, advantage, KL, policy and value losses, rollout/training correction, dynamic
sampling, overlong shaping, validation and asynchrony, plus a reward domain's role. Each is a typed section with its
own checks; the cross-section checks live in RLVRConfig.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from pydantic import Field, model_validator

from roll.pipelines.algorithms.pg_variants import PGVariantParams
from roll.pipelines.algorithms.train_infer import RatioDiffFilter
from roll.pipelines.config import RoleConfig
from roll.runtime import RollModel
from roll.strategies import GenerationConfig

__all__ = [
    "AdvantageSection",
    "AsyncSection",
    "CorrectionSection",
    "DynamicSamplingSection",
    "KLSection",
    "OverlongSection",
    "PolicyLossSection",
    "QueryFilterArgs",
    "QueryFilterConfig",
    "RewardConfig",
    "RolloutSection",
    "SampleMaskSection",
    "TrainInferFilterConfig",
    "UpdateSection",
    "ValidationSection",
    "ValueLossSection",
]

KLKind = Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs", "full"]
Estimator = Literal["gae", "grpo", "reinforce", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
_PG = PGVariantParams()
_PG_FIELDS = tuple(field.name for field in dataclasses.fields(PGVariantParams))


class QueryFilterArgs(RollModel):
    """Thresholds of a query filter (ROLL's ``filter_args``)."""

    threshold_up: float = Field(default=math.inf, description="mean_filter: drop groups whose mean score is >= this.")
    threshold_down: float = Field(default=-1.0, description="mean_filter: drop groups whose mean score is <= this.")
    std_threshold: float = Field(default=-1.0, description="std_filter: drop groups whose score std is <= this.")


class QueryFilterConfig(RollModel):
    """ROLL's per-domain query filter: prompt groups dropped by their scores, replaced by newly generated ones."""

    type: Literal["no_filter", "mean_filter", "std_filter"] = "no_filter"
    filter_args: QueryFilterArgs = Field(default_factory=QueryFilterArgs)


class RewardConfig(RoleConfig):
    """One reward domain: a cluster of reward workers and the sample tags routed to it."""

    reward_type: str = Field(
        default="math", description="Registered reward: math, code, python, llm_judge, llm_judge_api, ..."
    )
    reward_kwargs: dict[str, Any] = Field(default_factory=dict, description="Settings of that reward (see its docs).")
    tag_included: list[str] = Field(default_factory=list, description="Sample tags scored here (default: the domain).")
    query_filter_config: QueryFilterConfig = Field(
        default_factory=QueryFilterConfig,
        description="Drop this domain's prompt groups by mean or std of their scores and generate more (at most "
        "dynamic_sampling.max_generation_rounds rounds); groups of one sample are kept.",
    )


class RolloutSection(RollModel):
    """What one step generates, and how fresh the engine's weights are."""

    batch_size: int = Field(default=64, ge=1, description="Prompts per step; each gets n samples.")
    prompt_length: int = Field(default=256, ge=1, description="Longest prompt in tokens (longer prompts are dropped).")
    response_length: int = Field(
        default=256, ge=1, description="max_new_tokens of rollouts (actor_infer.generating_args.max_new_tokens)."
    )
    domain_interleave_probs: dict[str, float] | None = Field(
        default=None, description="Share of each domain in a rollout batch (default: as sampled from the data)."
    )
    model_update_frequency: int = Field(default=1, ge=1, description="Sync actor_train -> actor_infer every N steps.")
    dump: bool = Field(default=False, description="Write every step's samples to rollouts/step-N.jsonl.")


class UpdateSection(RollModel):
    """How a step's samples become optimizer steps."""

    epochs: int = Field(default=1, ge=1, description="Passes over the step's samples (PPO epochs).")
    mini_batch_size: int | None = Field(
        default=None, ge=1, description="Samples per optimizer step (default: the whole rollout batch, one step)."
    )
    critic_warmup: int = Field(default=0, ge=0, description="Steps that train only the critic.")

    def num_mini_batches(self, samples: int) -> int:
        return max(1, -(-samples // (self.mini_batch_size or samples or 1)))


class AdvantageSection(RollModel):
    """Reward shaping before the estimator, the estimator, and what is done to its output."""

    estimator: Estimator = "grpo"
    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=1.0, ge=0, le=1, description="GAE lambda.")
    norm_std: bool = Field(default=True, description="GRPO: divide by the group std (False: Dr. GRPO style).")
    reward_norm: Literal["none", "group", "batch"] = Field(
        default="none", description="Normalize scores before the estimator (GRPO/RLOO normalize by group anyway)."
    )
    reward_clip: float | None = Field(
        default=None,
        gt=0,
        description="Clamp rewards to [-clip, clip] after normalization, and the token rewards again after the KL "
        "penalty joins them (ROLL's order).",
    )
    whiten: bool = Field(default=False, description="Whiten advantages over the batch.")
    clip: float | None = Field(default=None, gt=0, description="Clip advantages to [-clip, clip].")
    norm_mean_type: Literal["batch", "group", "running"] | None = Field(
        default=None,
        description="ROLL reward normalization: subtract the batch, group or running (per reward domain, over every "
        "step so far) mean score (None: 0).",
    )
    norm_std_type: Literal["batch", "group", "running"] | None = Field(
        default=None,
        description="ROLL reward normalization: divide by the batch, group or running std (None: no division).",
    )
    domain_stats: bool = Field(
        default=False,
        description="ROLL's behaviour: compute each reward domain's targets on its own rows, so batch statistics "
        "(norm_*_type batch, reward_norm batch, whiten_rewards, whiten) are per domain when a batch mixes domains "
        "(ROLL configs set it; default: over the whole batch).",
    )
    whiten_rewards: bool = Field(
        default=False,
        description="ROLL: whiten the token rewards over the batch's loss tokens before the estimator (gae, "
        "reinforce, reinforce_plus_plus; grpo then runs as ROLL's: group-normalized rewards, REINFORCE returns).",
    )


class SampleMaskSection(RollModel):
    """ROLL's sample masks: whole responses left out of the loss by their group's difficulty or by length."""

    difficulty: bool = Field(default=False, description="Keep groups whose mean score is in (low, high).")
    difficulty_low: float = Field(default=0.0, description="Lower bound (exclusive) of the group mean score.")
    difficulty_high: float = Field(default=1.0, description="Upper bound (exclusive) of the group mean score.")
    error_max_len_clip: bool = Field(
        default=False, description="Keep correct responses and wrong ones shorter than error_max_len_threshold."
    )
    error_max_len_threshold: int = Field(default=9999999999, ge=1, description="Tokens; see error_max_len_clip.")


class KLSection(RollModel):
    """KL to the reference policy: as a per-token reward penalty (PPO style) and/or a loss term (GRPO style)."""

    penalty: KLKind = Field(
        default="k3",
        description="Per-token KL estimator of the sampled tokens; 'full': the exact KL over the whole vocabulary "
        "(the reference sends its whole log-softmax per response token: batch x length x vocab floats).",
    )
    loss_penalty: KLKind | None = Field(
        default=None,
        description="Estimator of the KL loss term (None: penalty). ROLL's actor always uses k3 for it, whatever "
        "kl_penalty says, so ROLL files set k3.",
    )
    in_reward: bool = Field(default=False, description="KL as a per-token reward penalty (PPO style).")
    use_loss: bool = Field(default=False, description="KL as a loss term with loss_coef (GRPO style).")
    init_coef: float = Field(
        default=0.05, ge=0, description="Coefficient of the reward penalty (its start if adaptive)."
    )
    ctrl_type: Literal["fixed", "adaptive"] = "fixed"
    target: float | None = Field(default=None, gt=0, description="Adaptive controller: the KL to hold.")
    horizon: int | None = Field(default=None, ge=1, description="Adaptive controller: samples to adapt over.")
    loss_coef: float = Field(default=0.001, ge=0)

    @model_validator(mode="after")
    def _check_controller(self) -> KLSection:
        if self.ctrl_type == "adaptive" and (self.target is None or self.horizon is None):
            raise ValueError("kl.ctrl_type=adaptive needs kl.target and kl.horizon (flat: target_kl and kl_horizon)")
        return self

    @property
    def in_reward_on(self) -> bool:
        return self.in_reward and self.init_coef > 0

    @property
    def loss_estimator(self) -> str:
        return self.loss_penalty or self.penalty

    @property
    def full_loss(self) -> bool:
        """The KL loss is the exact KL: the actor needs the reference's whole distributions."""
        return self.loss_on and self.loss_estimator == "full"

    @property
    def loss_on(self) -> bool:
        return self.use_loss and self.loss_coef > 0

    @property
    def needs_reference(self) -> bool:
        return self.in_reward_on or self.loss_on


class PolicyLossSection(RollModel):
    """The PPO-clip family: clip range (clip-higher), dual clip, token or sequence ratios (GSPO), entropy bonus;
    or another of ROLL's policy-gradient variants (``variant``; see roll.pipelines.algorithms.pg_variants)."""

    variant: Literal["ppo", "vanilla", "tis", "topr", "cispo", "kimi15"] = Field(
        default="ppo",
        description="ppo: PPO-clip (the clip settings below); vanilla: REINFORCE; tis: truncated-IS REINFORCE; "
        "topr: tapered off-policy REINFORCE; cispo: clipped-IS REINFORCE (MiniMax-M1); kimi15: Kimi k1.5.",
    )
    tis_lower_bound: float = Field(default=_PG.tis_lower_bound, description="variant tis: the ratio's lower clip.")
    tis_upper_bound: float = Field(default=_PG.tis_upper_bound, description="variant tis: the ratio's upper clip.")
    topr_positive_weight: float = Field(
        default=_PG.topr_positive_weight, description="variant topr: weight of score > 0 samples."
    )
    topr_negative_weight: float = Field(
        default=_PG.topr_negative_weight, description="variant topr: weight of score <= 0 samples."
    )
    cispo_epsilon_low: float = Field(default=_PG.cispo_epsilon_low, description="variant cispo: ratio floor 1 - eps.")
    cispo_epsilon_high: float = Field(
        default=_PG.cispo_epsilon_high, description="variant cispo: ratio ceiling 1 + eps."
    )
    cispo_unified_mask: bool = Field(
        default=_PG.cispo_unified_mask,
        description="variant cispo: drop tokens whose ratio left the range in the advantage's direction.",
    )
    kimi15_tau: float = Field(
        default=_PG.kimi15_tau, description="variant kimi15: weight of the squared log-ratio term."
    )
    rl_loss_coef: float = Field(
        default=1.0,
        ge=0,
        description="ROLL's rl_loss_coef: multiplies the policy-gradient + KL loss terms (not the entropy bonus); "
        "0 leaves only the entropy bonus and the score-split terms below.",
    )
    positive_loss_coef: float = Field(
        default=0.0,
        ge=0,
        description="ROLL's postive_loss_coef (ROLL <= 0.1 TOPR): adds coef * the REINFORCE loss -A * logp of the "
        "score > 0 samples, aggregated like the policy loss, without sample weights.",
    )
    topr_negative_loss_coef: float = Field(
        default=0.0,
        ge=0,
        description="ROLL's use_topr_neg_loss_coef (ROLL <= 0.1 TOPR): adds coef * -sg(clip(ratio, 0, 1)) * A * "
        "logp of the score <= 0 samples, aggregated like the policy loss, without sample weights.",
    )
    difficulty_loss_weight: bool = Field(
        default=False,
        description="Weigh each sample's policy loss by 0.5 + 1.5 * difficulty (its data column 'difficulty' in "
        "[0, 1]; add it to data_args.extra_keys), weights averaging 1 per micro-batch.",
    )
    length_loss_weight: bool = Field(
        default=False,
        description="Weigh each sample's policy loss by 1.5 - its min-max normalized response length (per "
        "micro-batch), weights averaging 1.",
    )
    clip: float = Field(default=0.2, gt=0)
    clip_low: float | None = Field(default=None, gt=0, description="Default: clip.")
    clip_high: float | None = Field(default=None, gt=0, description="Default: clip; raise it for clip-higher.")
    dual_clip: float | None = Field(default=None, gt=1, description="Dual-clip bound c for negative advantages.")
    importance_sampling: Literal["token", "sequence"] = Field(default="token", description="'sequence' is GSPO.")
    loss_agg_mode: LossAggMode = "token-mean"
    entropy_coef: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _check_variant_params(self) -> PolicyLossSection:
        self.pg_params()  # PGVariantParams checks the ranges (one source of truth)
        return self

    def pg_params(self) -> PGVariantParams:
        """The variants' constants, checked by :class:`PGVariantParams`."""
        return PGVariantParams(**{name: getattr(self, name) for name in _PG_FIELDS})


class ValueLossSection(RollModel):
    """The critic's clipped value loss."""

    clip: float | None = Field(default=0.5, gt=0, description="None: plain squared error.")


class TrainInferFilterConfig(RollModel):
    """One of ROLL's ``train_infer_correction.filters``: drop tokens (or whole responses, at the sequence levels)
    whose training-side old log-probs and rollout log-probs disagree (see roll.pipelines.algorithms.train_infer)."""

    enabled: bool = Field(default=False, description="Apply this rule (ROLL's default: off).")
    agg_type: Literal["token", "geometric", "sequence", "segment"] = Field(
        default="token",
        description="token: per token; geometric: exp(mean log-ratio) / mean diff per response; sequence: "
        "exp(sum log-ratio) / sum diff per response; segment: geometric per assistant turn.",
    )
    ratio_enabled: bool = Field(default=True, description="Keep ratio_low <= exp(old - rollout log-prob) <= high.")
    ratio_low: float = 0.8
    ratio_high: float = 1.2
    diff_enabled: bool = Field(default=False, description="Keep diff_low <= p_old - p_rollout <= diff_high.")
    diff_low: float = -0.2
    diff_high: float = 0.2

    def rule(self) -> RatioDiffFilter:
        return RatioDiffFilter(
            agg_type=self.agg_type,
            ratio_enabled=self.ratio_enabled,
            ratio_low=self.ratio_low,
            ratio_high=self.ratio_high,
            diff_enabled=self.diff_enabled,
            diff_low=self.diff_low,
            diff_high=self.diff_high,
        )

    @model_validator(mode="after")
    def _check_bounds(self) -> TrainInferFilterConfig:
        self.rule()  # RatioDiffFilter checks the bounds
        return self


class CorrectionSection(RollModel):
    """Rollout/training mismatch: truncated importance sampling, ROLL's ratio/diff filters, and where old log-probs
    come from."""

    tis_cap: float | None = Field(default=None, gt=0, description="Truncated importance sampling cap (None: off).")
    tis_level: Literal["token", "sequence"] = "token"
    tis_mode: Literal["truncate", "mask"] = "truncate"
    filters: list[TrainInferFilterConfig] = Field(
        default_factory=list,
        description="ROLL's train_infer_correction.filters, applied in order: tokens (or responses) they drop leave "
        "the loss (counted in train_infer/* metrics). Old log-probs are recomputed when one is enabled ('auto').",
    )
    old_log_probs_recompute: bool | Literal["auto"] = Field(
        default="auto",
        description=(
            "Recompute old log-probs with actor_train before training (False: use the rollout engine's). 'auto' "
            "recomputes only when the update is not one on-policy step (update.epochs > 1, several mini-batches, "
            "truncated IS, ratio/diff filters, KL in the reward); otherwise the training forward's own log-probs, "
            "detached, are the old ones, which is exact and saves a forward pass over the batch."
        ),
    )

    @property
    def filter_rules(self) -> list[RatioDiffFilter]:
        return [f.rule() for f in self.filters if f.enabled]


class DynamicSamplingSection(RollModel):
    """DAPO-style dynamic sampling: drop groups whose rewards all agree and generate more."""

    enabled: bool = Field(default=False, description="Drop groups whose rewards all agree; refill the batch.")
    max_generation_rounds: int = Field(default=4, ge=1, description="Generation rounds per step at most.")


class OverlongSection(RollModel):
    """Responses cut at rollout.response_length: leave them out of the loss, or penalize lengths near the limit."""

    mask_truncated: bool = Field(default=False, description="Exclude truncated responses from the loss.")
    buffer_len: int | None = Field(default=None, ge=1, description="DAPO soft overlong penalty window.")
    penalty_factor: float = Field(default=1.0, ge=0)


class ValidationSection(RollModel):
    """Validation on held-out prompts (every eval_steps and at the end)."""

    batch_size: int = Field(default=128, ge=1, description="Prompts per validation batch.")
    generating_args: GenerationConfig | None = Field(
        default=None, description="Sampling for validation (default: greedy); num_return_sequences k gives pass@k."
    )


class AsyncSection(RollModel):
    """Asynchronous training (ROLL Flash): per-request rollouts that overlap training, with bounded staleness.

    Off unless ``generation_ratio`` is set. Then the inference role runs as ``actor_infer.world_size`` independent
    engines fed one request at a time; a sample is never trained on by a policy more than ``generation_ratio``
    versions newer than the one that started it, rounded up (0: synchronous, still per request and fault tolerant).
    """

    generation_ratio: float | None = Field(
        default=None,
        ge=0,
        description="async_generation_ratio: how many steps generation may run ahead; samples are at most "
        "ceil(ratio) versions stale (None: off).",
    )
    partial_rollout_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Segment length of partial rollouts: a weight sync waits at most this many tokens per engine, "
        "then unfinished samples resume from their prefix under the new weights (None: whole responses).",
    )
    requests_per_call: int = Field(default=4, ge=1, description="Requests sent to an engine per call.")
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="An engine call still running after this long is hung: restart, re-issue."
    )
    max_restarts: int = Field(default=8, ge=0, description="Engine restarts allowed in a run before it fails.")

    @property
    def enabled(self) -> bool:
        return self.generation_ratio is not None
