"""roll's algorithm maths as pure functions on tensors: masked reductions, KL estimators and controllers,
reward shaping, advantage estimators, policy/value/KL/entropy losses, importance weights, DPO, knowledge
distillation (top-k teacher distributions, KD divergences, the OPD advantage) and the agentic (multi-turn)
estimators: reward normalisation by grouping, step returns, GiGPO, step_reinforce, agentic_reinforce.
Diffusion maths (noising, samplers, Reward-FL/DMD/ODE-distillation losses, image-distribution distances) live in
the :mod:`roll.pipelines.algorithms.diffusion` subpackage.

Conventions: token-level tensors are (batch, response_len) with a right-padded ``response_mask`` (bool or float,
non-zero = valid); response-level tensors are (batch,); groups of samples of one prompt are given by a (batch,)
integer ``group_index`` in any order. Results keep the floating dtype of their main input. Invalid arguments raise
:class:`roll.runtime.errors.ConfigError`.
"""

from __future__ import annotations

from roll.pipelines.algorithms import diffusion
from roll.pipelines.algorithms._masked import masked_mean, masked_sum, masked_var, masked_whiten
from roll.pipelines.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
    whiten_and_clip_advantages,
)
from roll.pipelines.algorithms.agentic import (
    NORM_TYPES,
    REWARD_NORM_METHODS,
    GigpoRewards,
    agentic_reinforce_advantages,
    gigpo_rewards,
    grouped_reward_norm,
    labels_to_index,
    reinforce_returns,
    reward_norm_types,
    segment_masked_mean,
    state_group_index,
    step_discounted_returns,
    step_reinforce_rewards,
)
from roll.pipelines.algorithms.distill import (
    KD_OBJECTIVES,
    TeacherTopK,
    gather_student_logits,
    kd_divergence,
    kd_loss,
    opd_advantages,
    opd_dense_divergence,
    teacher_topk,
)
from roll.pipelines.algorithms.dpo import DPO_LOSS_TYPES, dpo_loss, sequence_log_probs
from roll.pipelines.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    full_kl,
    kl_penalty,
    make_kl_controller,
)
from roll.pipelines.algorithms.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    entropy_loss,
    kl_loss,
    policy_loss,
    truncated_importance_weights,
    value_loss,
)
from roll.pipelines.algorithms.rewards import (
    NORMALIZE_MODES,
    clip_rewards,
    clip_rewards_counted,
    normalize_scores,
    overlong_mask,
    overlong_penalty,
    token_level_rewards_from_scores,
    zero_variance_group_mask,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DPO_LOSS_TYPES",
    "KD_OBJECTIVES",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "NORMALIZE_MODES",
    "NORM_TYPES",
    "REWARD_NORM_METHODS",
    "AdaptiveKLController",
    "FixedKLController",
    "GigpoRewards",
    "TeacherTopK",
    "agentic_reinforce_advantages",
    "aggregate_loss",
    "clip_rewards",
    "clip_rewards_counted",
    "compute_advantages",
    "diffusion",
    "dpo_loss",
    "entropy_loss",
    "full_kl",
    "gae_advantages",
    "gather_student_logits",
    "gigpo_rewards",
    "grouped_reward_norm",
    "grpo_advantages",
    "kd_divergence",
    "kd_loss",
    "kl_loss",
    "kl_penalty",
    "labels_to_index",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "normalize_scores",
    "opd_advantages",
    "opd_dense_divergence",
    "overlong_mask",
    "overlong_penalty",
    "policy_loss",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "reinforce_returns",
    "reward_norm_types",
    "rloo_advantages",
    "segment_masked_mean",
    "sequence_log_probs",
    "state_group_index",
    "step_discounted_returns",
    "step_reinforce_rewards",
    "teacher_topk",
    "token_level_rewards_from_scores",
    "truncated_importance_weights",
    "value_loss",
    "whiten_and_clip_advantages",
    "zero_variance_group_mask",
]
