"""From scored samples to training targets: masks, reward shaping, KL, advantages, importance weights.

Reads ``scores``, ``response_mask``, ``finish_reason``, ``group_index``, ``old_log_probs``, optionally
``ref_log_probs``, ``values`` and ``rollout_log_probs``; writes ``token_level_rewards``, ``advantages``,
``returns``, the training ``response_mask`` (truncated responses removed when ``mask_truncated``) and
``is_weights`` (when ``correction.tis_cap`` is set). With on-policy distillation (``opd``) it also reads
``teacher_log_probs`` (see :mod:`roll.pipelines.rlvr.opd`). All maths comes from :mod:`roll.pipelines.algorithms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch

from roll.pipelines.algorithms import (
    clip_rewards_counted,
    compute_advantages,
    kl_penalty,
    masked_mean,
    normalize_scores,
    overlong_penalty,
    token_level_rewards_from_scores,
    truncated_importance_weights,
    whiten_and_clip_advantages,
)
from roll.pipelines.algorithms.kl import full_kl
from roll.pipelines.algorithms.roll_knobs import (
    RunningMoments,
    difficulty_mask,
    error_length_mask,
    normalize_rewards,
    reinforce_returns,
    whiten_token_rewards,
)
from roll.pipelines.algorithms.train_infer import train_infer_filter_mask
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.opd import apply_opd
from roll.pipelines.rlvr.sections import AdvantageSection
from roll.protocol import DataProto
from roll.runtime import ConfigError

__all__ = ["compute_training_targets"]


def _estimator_inputs(advantage: AdvantageSection, data, scores, token_rewards, mask) -> dict:
    name = advantage.estimator
    if name == "gae":
        return {
            "token_level_rewards": token_rewards,
            "values": data["values"],
            "response_mask": mask,
            "gamma": advantage.gamma,
            "lam": advantage.lam,
        }
    if name == "grpo":
        return {
            "scores": scores,
            "response_mask": mask,
            "group_index": data["group_index"],
            "norm_by_std": advantage.norm_std,
        }
    if name in ("reinforce_plus_plus", "reinforce"):
        return {"token_level_rewards": token_rewards, "response_mask": mask, "gamma": advantage.gamma}
    return {"scores": scores, "response_mask": mask, "group_index": data["group_index"]}


def _sample_mask(config: RLVRConfig, raw_scores, group_index, lengths, truncated) -> torch.Tensor:
    """(batch, 1) of 1/0: samples kept in the loss by the overlong and ROLL sample masks (on raw scores)."""
    keep = torch.ones_like(lengths)
    if config.overlong.mask_truncated:
        keep = keep * (~truncated).float()
    masks = config.sample_mask
    if masks.difficulty:
        keep = keep * difficulty_mask(raw_scores, group_index, masks.difficulty_low, masks.difficulty_high)
    if masks.error_max_len_clip:
        keep = keep * error_length_mask(raw_scores, lengths, masks.error_max_len_threshold)
    return keep.unsqueeze(-1)


def _roll_reward_norm(
    batch: DataProto, scores: torch.Tensor, config: RLVRConfig, running: Mapping[str, RunningMoments] | None
) -> torch.Tensor:
    """ROLL's norm_mean_type / norm_std_type (with ``whiten_rewards`` under GRPO, the group normalization that ROLL
    applies to GRPO). 'running' keeps one RunningMoments per reward domain, updated with the domain's scores, and
    then normalizes each domain's rows by its own statistics, as ROLL does per domain."""
    advantage = config.advantage
    mean_type, std_type = advantage.norm_mean_type, advantage.norm_std_type
    if advantage.estimator == "grpo" and advantage.whiten_rewards:
        mean_type, std_type = "group", ("group" if advantage.norm_std else None)
    if mean_type is None and std_type is None:
        return scores
    group_index = batch.batch["group_index"]
    if "running" not in (mean_type, std_type):
        return normalize_rewards(scores, group_index, mean_type, std_type)
    if running is None:
        raise ConfigError("norm_mean_type/norm_std_type 'running' needs the pipeline's running moments per domain")
    owner = {tag: domain for domain, reward in config.rewards.items() for tag in reward.tag_included}
    domains = [owner.get(str(tag), "") for tag in batch.non_tensor_batch["tag"]]
    out = scores.clone()
    for domain in sorted(set(domains)):
        rows = torch.tensor([d == domain for d in domains])
        moments = running[domain]
        moments.update(scores[rows])
        out[rows] = normalize_rewards(scores[rows], group_index[rows], mean_type, std_type, moments)
    return out


def _kl(batch: DataProto, config: RLVRConfig) -> torch.Tensor | None:
    """Per-token KL of the old policy to the reference (None without a reference). Penalty 'full': the exact KL of
    the whole distributions (``old_full_log_probs`` is then dropped; ``ref_full_log_probs`` is kept only for the KL
    loss), or None when the old policy's distributions were not recomputed."""
    data = batch.batch
    if "ref_log_probs" not in data.keys():
        return None
    if config.kl.penalty != "full":
        return kl_penalty(data["old_log_probs"], data["ref_log_probs"], config.kl.penalty)
    old_full = cast(
        "torch.Tensor | None", data.pop("old_full_log_probs") if "old_full_log_probs" in data.keys() else None
    )
    ref_full: torch.Tensor | None = data["ref_full_log_probs"] if "ref_full_log_probs" in data.keys() else None
    if ref_full is not None and not config.kl.full_loss:
        data.pop("ref_full_log_probs")
    if old_full is None or ref_full is None:
        if config.kl.in_reward_on:
            raise ConfigError("kl.penalty=full in the reward needs old_full_log_probs and ref_full_log_probs")
        return None
    return full_kl(old_full, ref_full)


def _sample_weight_inputs(batch: DataProto, config: RLVRConfig, lengths: torch.Tensor) -> None:
    """What the actor's difficulty/length loss weights read: ``response_lengths`` (before sample masks, as ROLL)
    and ``difficulty`` (the data column) as (batch,) float tensors."""
    loss = config.policy_loss
    if not (loss.difficulty_loss_weight or loss.length_loss_weight):
        return
    batch.batch["response_lengths"] = lengths.float()
    if loss.difficulty_loss_weight:
        if "difficulty" not in batch.non_tensor_batch:
            raise ConfigError(
                "policy_loss.difficulty_loss_weight needs a 'difficulty' column in the prompts; add it to "
                "actor_train.data_args.extra_keys"
            )
        values = [float(v) for v in batch.non_tensor_batch["difficulty"]]
        batch.batch["difficulty"] = torch.tensor(values, dtype=torch.float32)


# Counts, summed over domains (the other metrics are averaged, weighted by each domain's rows); opd/samples/<teacher>
# are the per-teacher sample counts.
_COUNTS = ("rollout/masked_samples", "actor/train_infer_masked_tokens", "actor/train_infer_masked_sequences")
_COUNT_PREFIX = "opd/samples/"
_OUTPUTS = (
    "token_level_rewards",
    "advantages",
    "returns",
    "response_mask",
    "is_weights",
    "response_lengths",
    "difficulty",
)


def _domains(batch: DataProto, config: RLVRConfig) -> list[str]:
    """Each row's reward domain (from its tag), '' for a tag no domain claims."""
    if "tag" not in batch.non_tensor_batch:
        return [""] * len(batch)
    owner = {tag: domain for domain, reward in config.rewards.items() for tag in reward.tag_included}
    return [owner.get(str(tag), "") for tag in batch.non_tensor_batch["tag"]]


def compute_training_targets(
    batch: DataProto, config: RLVRConfig, kl_coef: float, running: Mapping[str, RunningMoments] | None = None
) -> dict[str, float]:
    """Fill the training fields of ``batch`` in place; returns metrics (KL, masks, reward statistics).

    ``running``: per reward domain, the running score moments of ``norm_*_type: running`` (updated here).
    With ``advantage.domain_stats`` (ROLL's behaviour) each reward domain's rows get their targets on their own, so
    batch-wide statistics (reward normalization, whitening, clip fractions) are per domain; metrics are then the
    row-weighted means over domains, plus ``<metric>/<domain>`` for each domain."""
    domains = _domains(batch, config)
    names = sorted(set(domains))
    if not config.advantage.domain_stats or len(names) < 2:
        return _targets(batch, config, kl_coef, running)
    rows_of = {name: [i for i, d in enumerate(domains) if d == name] for name in names}
    parts = {name: batch.select_idxs(rows) for name, rows in rows_of.items()}
    per_domain = {name: _targets(part, config, kl_coef, running) for name, part in parts.items()}
    for key in _OUTPUTS:
        present = [name for name in names if key in parts[name].batch.keys()]
        if not present:
            continue
        first = parts[present[0]].batch[key]
        full = torch.zeros((len(batch), *first.shape[1:]), dtype=first.dtype)
        for name in present:
            full[torch.tensor(rows_of[name])] = parts[name].batch[key].to(first.dtype)
        batch.batch[key] = full
    dropped = ("old_full_log_probs",) if config.kl.full_loss else ("old_full_log_probs", "ref_full_log_probs")
    for key in dropped:  # kl penalty 'full': each domain used its rows' distributions
        if key in batch.batch.keys():
            batch.batch.pop(key)
    metrics: dict[str, float] = {}
    for key in sorted({k for m in per_domain.values() for k in m}):
        owned = [name for name in names if key in per_domain[name]]
        count = key in _COUNTS or key.startswith(_COUNT_PREFIX)
        weights = {name: 1.0 if count else len(rows_of[name]) for name in owned}
        total = 1.0 if count else sum(weights.values())
        metrics[key] = sum(per_domain[name][key] * weights[name] for name in owned) / total
        metrics.update({f"{key}/{name or 'untagged'}": per_domain[name][key] for name in owned})
    return metrics


def _targets(
    batch: DataProto, config: RLVRConfig, kl_coef: float, running: Mapping[str, RunningMoments] | None
) -> dict[str, float]:
    data = batch.batch
    response_mask = data["response_mask"].float()
    lengths = response_mask.sum(-1)
    truncated = torch.tensor(
        [reason == "length" for reason in batch.non_tensor_batch["finish_reason"]], dtype=torch.bool
    )
    scores = data["scores"].float().clone()
    metrics: dict[str, float] = {}
    advantage, overlong, correction = config.advantage, config.overlong, config.correction
    if overlong.buffer_len:
        penalty = overlong_penalty(
            lengths, config.rollout.response_length, overlong.buffer_len, overlong.penalty_factor
        )
        scores = scores + penalty
        metrics["rollout/overlong_penalty"] = float(penalty.mean())
    scores = normalize_scores(scores, data["group_index"], advantage.reward_norm)
    scores = _roll_reward_norm(batch, scores, config, running)
    # ROLL: after normalization
    scores = clip_rewards_counted(scores, advantage.reward_clip, metrics, "critic/reward_clip_frac")
    kl = _kl(batch, config)
    if kl is not None:
        metrics["actor/kl"] = float(masked_mean(kl, response_mask))
    if config.kl.in_reward_on and kl is not None:
        token_rewards = token_level_rewards_from_scores(scores, response_mask, kl=kl, kl_coef=kl_coef)
    else:
        token_rewards = token_level_rewards_from_scores(scores, response_mask)
    # ROLL clips again after the KL penalty joins the token rewards (compute_token_reward)
    token_rewards = clip_rewards_counted(
        token_rewards, advantage.reward_clip, metrics, "critic/token_reward_clip_frac", response_mask
    )
    loss_mask = response_mask * _sample_mask(config, data["scores"].float(), data["group_index"], lengths, truncated)
    if advantage.whiten_rewards:  # ROLL: over the tokens left in the loss, before the estimator
        token_rewards = whiten_token_rewards(token_rewards, loss_mask)
    opd_coefs = {name: t.opd_kl_coef for name, t in config.teacher_roles().items()} if config.opd.on else {}
    if config.opd.pure and opd_coefs:  # the teachers' KL is the whole advantage (and its return)
        advantages, opd_metrics = apply_opd(data, None, response_mask, config.opd, opd_coefs)
        returns = advantages
        metrics.update(opd_metrics)
    else:
        inputs = _estimator_inputs(advantage, data, scores, token_rewards, response_mask)
        if advantage.estimator == "reinforce":
            advantages, returns = reinforce_returns(**inputs)  # type: ignore[arg-type]
        elif advantage.estimator == "grpo" and advantage.whiten_rewards:
            # ROLL's GRPO: group-normalized scores as token rewards (whitened above), then REINFORCE returns
            advantages, returns = reinforce_returns(token_rewards, response_mask, advantage.gamma)
        else:
            advantages, returns = compute_advantages(advantage.estimator, **inputs)
        if opd_coefs:
            advantages, opd_metrics = apply_opd(data, advantages, response_mask, config.opd, opd_coefs)
            metrics.update(opd_metrics)
    advantages = whiten_and_clip_advantages(advantages, loss_mask, advantage.whiten, advantage.clip, metrics)
    _sample_weight_inputs(batch, config, lengths)
    data["token_level_rewards"] = token_rewards
    data["advantages"] = advantages * loss_mask
    data["returns"] = returns
    if correction.tis_cap is not None:
        weights, tis_metrics = truncated_importance_weights(
            data["old_log_probs"],
            data["rollout_log_probs"],
            loss_mask,
            cap=correction.tis_cap,
            level=correction.tis_level,
            mode=correction.tis_mode,
        )
        data["is_weights"] = weights
        metrics.update({f"tis/{k}": v for k, v in tis_metrics.items()})
    rules = correction.filter_rules
    if rules:  # ROLL: after the advantages, on the loss mask only
        keep, filter_metrics = train_infer_filter_mask(
            data["old_log_probs"], data["rollout_log_probs"], loss_mask, rules
        )
        loss_mask = loss_mask * keep
        metrics.update({f"actor/{k}": v for k, v in filter_metrics.items()})
    data["response_mask"] = loss_mask
    valid = loss_mask.sum(-1) > 0
    metrics.update(
        {
            "rollout/truncated_frac": float(truncated.float().mean()),
            "rollout/masked_samples": float((~valid).sum()),
            "actor/advantage_mean": float(masked_mean(advantages, loss_mask)) if valid.any() else 0.0,
            "actor/kl_coef": float(kl_coef),
        }
    )
    return metrics
