"""From played episodes to training targets: response-level rewards, then token-level advantages.

Trajectory-wise rows (one per episode): ``scores`` is the episode score. ``grpo``/``reinforce`` normalize it with
``reward_normalization`` (GRPO's default: mean/std within ``traj_group_id``, the episodes sharing a seed) and give
every assistant token of the row that value; ``agentic_reinforce`` places each turn's reward (``step_scores``) on
its last token and discounts per turn; ``gae`` runs GAE with the critic's values.

Step-wise rows (one per turn): ``gigpo`` adds the episode score normalized with ``reward_normalization`` (by
default mean/std within ``traj_group_id``, its episode group) and the discounted step return normalized within
(episode group, state) groups by the same ``reward_normalization.method``, as ROLL does, weighted by
``episode_reward_weight`` and ``step_reward_weight``; ``step_reinforce`` normalizes the discounted step return with ``reward_normalization``;
``grpo``/``reinforce`` use the episode score of the row's episode.

With ``kl.in_reward`` (ROLL's ``add_token_level_kl``) every estimator's token rewards lose ``coef x KL(old policy ||
reference)`` on each assistant token, as ROLL's ``compute_token_reward``; agentic_reinforce sums a turn's token
rewards, so a turn's return carries the KL of all its tokens. ``advantage.whiten_rewards`` (ROLL's ``whiten_rewards``)
whitens the token rewards over the batch's response tokens before the estimator (not with agentic_reinforce).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from roll.agentic.pipeline.config import AgenticConfig
from roll.pipelines.algorithms import (
    agentic_reinforce_advantages,
    clip_rewards_counted,
    compute_advantages,
    gigpo_rewards,
    grouped_reward_norm,
    kl_penalty,
    labels_to_index,
    masked_mean,
    reinforce_returns,
    reward_norm_types,
    state_group_index,
    step_discounted_returns,
    token_level_rewards_from_scores,
    whiten_and_clip_advantages,
)
from roll.pipelines.algorithms.roll_knobs import whiten_token_rewards
from roll.pipelines.algorithms.train_infer import train_infer_filter_mask
from roll.pipelines.rlvr.opd import apply_opd
from roll.protocol import DataProto
from roll.runtime import ConfigError

__all__ = ["attach_step_returns", "compute_agentic_targets", "episode_weights", "turn_rewards_to_tokens"]

_CLIP_FRAC = "critic/reward_clip_frac"  # the share of rewards reward_clip clamped (ROLL's metric name)


def _column(batch: DataProto, name: str) -> list[Any]:
    columns = batch.non_tensor_batch
    if name not in columns:
        raise ConfigError(f"agentic samples lack the column {name!r}; were they made by a roll.agentic env manager?")
    return list(columns[name])


def _group_index(batch: DataProto, grouping: str) -> torch.Tensor | None:
    return None if grouping == "batch" else labels_to_index(_column(batch, grouping))


def turn_rewards_to_tokens(step_scores: Sequence[Sequence[float]], response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards of trajectory-wise rows: turn k's reward on the last token of the row's k-th assistant
    segment (a maximal run of ``response_mask``). (batch, response_len)."""
    valid = response_mask.bool()
    rewards = torch.zeros(valid.shape, dtype=torch.float32)
    nxt = torch.zeros_like(valid)
    nxt[:, :-1] = valid[:, 1:]
    ends = valid & ~nxt
    for row, scores in enumerate(step_scores):
        positions = ends[row].nonzero().flatten().tolist()
        if len(positions) != len(scores):
            raise ConfigError(f"row {row}: {len(scores)} turn rewards for {len(positions)} assistant segments")
        for position, score in zip(positions, scores):
            rewards[row, position] = float(score)
    return rewards


def attach_step_returns(batch: DataProto, config: AgenticConfig) -> None:
    """Store each step-wise row's discounted return over its episode's later turns (``step_returns``) in ``batch``,
    for the estimators that read them (gigpo, step_reinforce); a no-op for the others.

    ROLL's order (``compute_discounted_returns`` before ``adjust_batch``): the returns need every turn of an episode,
    so they are taken while the rollout is whole; a batch adjusted afterwards (rows dropped or copied to split over
    the training ranks) keeps the returns its rows had."""
    if config.layout == "step" and config.advantage.estimator in ("gigpo", "step_reinforce"):
        batch.batch["step_returns"] = _discounted(batch, config)


def _discounted(batch: DataProto, config: AgenticConfig) -> torch.Tensor:
    traj_index = labels_to_index(_column(batch, "traj_id"))
    steps = torch.tensor([int(v) for v in _column(batch, "step")])
    return step_discounted_returns(batch.batch["scores"].float(), traj_index, steps, config.advantage.step_reward_gamma)


def _step_returns(batch: DataProto, config: AgenticConfig) -> torch.Tensor:
    """The returns :func:`attach_step_returns` stored, or (a batch used as the rollout gave it) computed now."""
    if "step_returns" in batch.batch.keys():
        return batch.batch["step_returns"].float()
    return _discounted(batch, config)


def _response_rewards(batch: DataProto, config: AgenticConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """(batch,) rewards for the estimators that spread one value over a row."""
    norm = config.reward_normalization
    advantage = config.advantage
    estimator = advantage.estimator
    metrics: dict[str, float] = {}
    if config.layout == "traj":
        scores = batch.batch["scores"].float()
        return grouped_reward_norm(
            scores, _group_index(batch, norm.grouping), norm.norm_mean_type, norm.norm_std_type
        ), metrics
    episode_scores = torch.tensor([float(v) for v in _column(batch, "episode_scores")])
    if estimator == "gigpo":
        step_returns = _step_returns(batch, config)
        episode_groups = labels_to_index(_column(batch, "traj_group_id"))
        states = state_group_index(episode_groups, labels_to_index(_column(batch, "state_hash")))
        # ROLL: the episode part with reward_normalization, the step part with its method over state groups
        parts = gigpo_rewards(
            episode_scores,
            step_returns,
            _group_index(batch, norm.grouping),
            states,
            episode_reward_weight=advantage.episode_reward_weight,
            step_reward_weight=advantage.step_reward_weight,
            episode_norm=(norm.norm_mean_type, norm.norm_std_type),
            step_norm=reward_norm_types(norm.method, "state_group_id"),
        )
        sizes = torch.bincount(states)
        metrics["advantage/state_groups"] = float(len(sizes))
        metrics["advantage/state_group_size"] = float(sizes.float().mean())
        metrics["advantage/step_part_abs"] = float(parts.step.abs().mean())
        metrics["advantage/episode_part_abs"] = float(parts.episode.abs().mean())
        return parts.rewards, metrics
    if estimator == "step_reinforce":
        values = _step_returns(batch, config)
    else:  # grpo / reinforce on step-wise rows: the episode's score
        values = episode_scores
    group = _group_index(batch, norm.grouping)
    return grouped_reward_norm(values, group, norm.norm_mean_type, norm.norm_std_type), metrics


def episode_weights(batch: DataProto) -> torch.Tensor:
    """(batch,) weights under which every episode (``traj_id``) weighs the same: rows / (episodes * its rows), so a
    row of an episode with n rows gets 1/n of the episode's share and the weights average to 1."""
    episodes = labels_to_index(_column(batch, "traj_id"))
    rows_per_episode = torch.bincount(episodes).float()
    return len(episodes) / (len(rows_per_episode) * rows_per_episode[episodes])


def _reward_kl(batch: DataProto, config: AgenticConfig, metrics: dict[str, float]) -> torch.Tensor | None:
    """Per-token KL of the old policy to the reference (``kl.penalty``) when ``kl.in_reward`` is on, else None;
    its mean over the assistant tokens goes to ``actor/kl`` (what an adaptive controller follows)."""
    if not config.kl.in_reward_on:
        return None
    data = batch.batch
    if "ref_log_probs" not in data.keys():
        raise ConfigError("kl.in_reward (add_token_level_kl) needs the reference's log-probs: add a reference role")
    kl = kl_penalty(data["old_log_probs"].float(), data["ref_log_probs"].float(), config.kl.penalty)
    metrics["actor/kl"] = float(masked_mean(kl, data["response_mask"].float()))
    return kl


def _minus_kl(token_rewards: torch.Tensor, kl: torch.Tensor | None, coef: float, mask: torch.Tensor) -> torch.Tensor:
    return token_rewards if kl is None else token_rewards - coef * kl * mask


def _whitened(token_rewards: torch.Tensor, config: AgenticConfig, mask: torch.Tensor) -> torch.Tensor:
    """ROLL's ``whiten_rewards``: the token rewards whitened over the batch's response tokens, before the estimator."""
    return whiten_token_rewards(token_rewards, mask) if config.advantage.whiten_rewards else token_rewards


def _estimator_targets(
    batch: DataProto, config: AgenticConfig, kl_coef: float, metrics: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token rewards, advantages, returns) of ``advantage.estimator`` on the episodes' scores, before whitening."""
    data = batch.batch
    mask = data["response_mask"].float()
    advantage = config.advantage
    estimator = advantage.estimator
    kl = _reward_kl(batch, config, metrics)
    if kl is not None:
        metrics["critic/kl_coef"] = float(kl_coef)
    if estimator == "agentic_reinforce":
        token_rewards = turn_rewards_to_tokens(_column(batch, "step_scores"), mask)
        token_rewards = _minus_kl(token_rewards, kl, kl_coef, mask)
        token_rewards = clip_rewards_counted(token_rewards, advantage.reward_clip, metrics, _CLIP_FRAC, mask)
        advantages, returns = agentic_reinforce_advantages(token_rewards, mask, advantage.gamma)
    elif estimator == "gae":
        token_rewards = token_level_rewards_from_scores(data["scores"].float(), mask)
        token_rewards = _minus_kl(token_rewards, kl, kl_coef, mask)
        token_rewards = clip_rewards_counted(token_rewards, advantage.reward_clip, metrics, _CLIP_FRAC, mask)
        token_rewards = _whitened(token_rewards, config, mask)
        advantages, returns = compute_advantages(
            "gae",
            token_level_rewards=token_rewards,
            values=data["values"],
            response_mask=mask,
            gamma=advantage.gamma,
            lam=advantage.lam,
        )
    else:
        rewards, reward_metrics = _response_rewards(batch, config)
        metrics.update(reward_metrics)
        # ROLL: after the normalization
        rewards = clip_rewards_counted(rewards, advantage.reward_clip, metrics, _CLIP_FRAC)
        token_rewards = token_level_rewards_from_scores(rewards, mask)
        if kl is not None:  # ROLL clips the token rewards again once the KL penalty joined them
            token_rewards = _minus_kl(token_rewards, kl, kl_coef, mask)
            token_rewards = clip_rewards_counted(
                token_rewards, advantage.reward_clip, metrics, "critic/token_reward_clip_frac", mask
            )
        token_rewards = _whitened(token_rewards, config, mask)
        advantages, returns = reinforce_returns(token_rewards, mask, advantage.gamma)
        metrics["advantage/reward_mean"] = float(rewards.mean())
        metrics["advantage/reward_abs"] = float(rewards.abs().mean())
    return token_rewards, advantages, returns


def compute_agentic_targets(batch: DataProto, config: AgenticConfig, kl_coef: float = 0.0) -> dict[str, float]:
    """Fill ``token_level_rewards``, ``advantages`` and ``returns`` of ``batch`` in place; returns metrics.

    ``kl_coef``: the KL controller's coefficient of the in-reward KL (``kl.in_reward``; ignored when it is off).
    On-policy distillation (``opd``): in pure OPD the advantage is the teachers' ``-opd_kl_coef x KL(student ||
    teacher)`` per token (no reward, no estimator; returns = advantages, as ROLL's); in mixed OPD that term is added
    to the estimator's advantage; whitening and clipping follow in both, as in ROLL."""
    data = batch.batch
    mask = data["response_mask"].float()
    advantage = config.advantage
    metrics: dict[str, float] = {}
    coefs = {name: role.opd_kl_coef for name, role in config.teacher_roles().items()}
    if config.opd.pure:
        advantages, opd_metrics = apply_opd(data, None, mask, config.opd, coefs)
        token_rewards, returns = torch.zeros_like(mask), advantages
        metrics.update(opd_metrics)
    else:
        token_rewards, advantages, returns = _estimator_targets(batch, config, kl_coef, metrics)
        if config.opd.mixed:
            advantages, opd_metrics = apply_opd(data, advantages, mask, config.opd, coefs)
            metrics.update(opd_metrics)
    advantages = whiten_and_clip_advantages(advantages, mask, advantage.whiten, advantage.clip, metrics)
    data["token_level_rewards"] = token_rewards
    data["advantages"] = advantages * mask
    data["returns"] = returns
    if config.policy_loss.equal_episode_weights:  # per-token weights of the actor's policy-gradient term
        weights = episode_weights(batch)
        data["is_weights"] = weights.unsqueeze(-1).expand_as(mask).contiguous()
        metrics["advantage/episode_weight_max"] = float(weights.max())
    rules = config.correction.filter_rules
    if rules:  # ROLL: after the advantages, on the loss mask only
        keep, filter_metrics = train_infer_filter_mask(data["old_log_probs"], data["rollout_log_probs"], mask, rules)
        data["response_mask"] = (mask * keep).to(data["response_mask"].dtype)
        metrics.update({f"actor/{k}": v for k, v in filter_metrics.items()})
    metrics["actor/advantage_mean"] = float(masked_mean(advantages, mask))
    metrics["advantage/zero_rows"] = float(((advantages.abs() * mask).sum(-1) == 0).float().mean())
    return metrics
