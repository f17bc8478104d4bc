"""The model roles of RLVR: rollout engine, policy (log-probs and PPO-family updates), reference, critic.

Losses are algorithm maths from :mod:`roll.pipelines.algorithms`; strategies only run them. Each worker gets its
own settings at ``initialize`` (:mod:`roll.pipelines.rlvr.settings`) and its update schedule per call
(:class:`~roll.pipelines.stages.UpdatePlan`). Each role's batch fields are listed in the method docstrings
(producer and consumers agree on name, dtype and shape).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from roll.pipelines.algorithms import (
    aggregate_loss,
    entropy_loss,
    kl_loss,
    masked_mean,
    opd_dense_divergence,
    policy_loss,
    teacher_topk,
    value_loss,
)
from roll.pipelines.algorithms.kl import FULL_KL, full_kl
from roll.pipelines.algorithms.pg_variants import pg_variant_loss, score_split_loss
from roll.pipelines.algorithms.roll_knobs import sample_loss_weights
from roll.pipelines.rlvr.opd import TEACHER_TOPK_INDICES, TEACHER_TOPK_LOG_PROBS
from roll.pipelines.rlvr.settings import ActorSettings, CriticSettings, PolicySettings
from roll.pipelines.stages import UpdatePlan, run_update
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.strategies import SHARE, GenerationConfig, LossScale, StrategyWorker
from roll.strategies.ops import entropy_from_logits, log_probs_from_logits, response_logits
from roll.strategies.requests import GenerateRequest, GenerateResult, generate_requests

__all__ = [
    "ActorWorker",
    "CriticWorker",
    "InferWorker",
    "PolicyWorker",
    "actor_loss",
    "opd_dense_loss",
    "policy_gradient_loss",
]


def _response_length(batch: DataProto) -> int:
    return batch.batch["responses"].shape[1]


def _log_softmax(predicting: torch.Tensor, temperature: float) -> torch.Tensor:
    """The whole log-softmax at the sampling temperature, float32 (kl penalty 'full')."""
    logits = predicting.float()
    return torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)


def _check_full_distribution_size(rows: int, length: int, vocab: int) -> None:
    """kl penalty 'full' ships (rows, length, vocab) float32 per rank to the driver: refuse what cannot fit.

    The bound is ``ROLL_FULL_KL_MAX_GIB`` (default 4 GiB per rank's batch); a 150k-token vocabulary passes it only
    for a few thousand response tokens, so real-size runs should use a per-token estimator (k3, low_var_kl).
    """
    limit_gib = float(os.environ.get("ROLL_FULL_KL_MAX_GIB", "4"))
    size_gib = rows * length * vocab * 4 / 2**30
    if size_gib > limit_gib:
        raise ConfigError(
            f"kl.penalty='full' (ROLL kl_penalty: full) would send {size_gib:.1f} GiB of whole distributions for "
            f"{rows} rows x {length} response tokens x {vocab} vocabulary entries from one rank (limit "
            f"ROLL_FULL_KL_MAX_GIB={limit_gib:g}); use kl.penalty k3 or low_var_kl, or fewer/shorter responses"
        )


def _logits_to_keep(length: int) -> int:
    """The positions ``response_logits`` reads: the last prompt token predicts the first response token."""
    return length + 1


def actor_loss(
    settings: ActorSettings, micro: DataProto, logits: torch.Tensor, scale: LossScale, *, on_policy: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one micro-batch: ``rl_loss_coef * (PPO-clip family + KL loss) - entropy bonus`` plus
    ROLL's score-split terms, and its metrics.

    ``on_policy``: one on-policy update without a recompute pass, so this forward's own log-probs (detached) are
    the old policy's and ``old_log_probs`` is not read.
    """
    data = micro.batch
    predicting = response_logits(logits, data["responses"].shape[1])
    log_probs = log_probs_from_logits(predicting, data["responses"], settings.temperature)
    mask = data["response_mask"]
    counts = {"num_tokens": scale.num_tokens, "num_seqs": scale.num_seqs}
    old_log_probs = log_probs.detach() if on_policy else data["old_log_probs"]
    loss, metrics = policy_gradient_loss(settings, log_probs, old_log_probs, micro, counts)
    metrics = {f"actor/{k}": v for k, v in metrics.items()}
    metrics[f"actor/pg_loss{SHARE}"] = float(loss.detach())
    if on_policy:  # the recompute pass would have reported it
        with torch.no_grad():
            entropy = entropy_from_logits(predicting, settings.temperature)
            metrics["actor/entropy"] = float(masked_mean(entropy, mask))
    if settings.kl_loss_on:
        kl = _kl_loss(settings, predicting, log_probs, micro, counts)
        loss = loss + settings.kl_loss_coef * kl
        metrics[f"actor/kl_loss{SHARE}"] = float(kl.detach())
    if settings.rl_loss_coef != 1.0:  # ROLL: scales the policy-gradient + KL terms, not the entropy bonus
        loss = loss * settings.rl_loss_coef
    if settings.opd_dense_objective is not None:  # roll's dense OPD: its own term, outside rl_loss_coef
        dense = opd_dense_loss(settings, predicting, micro, counts)
        loss = loss + settings.opd_dense_coef * dense
        metrics[f"actor/opd_dense_loss{SHARE}"] = float(dense.detach())
    if settings.entropy_coef > 0:
        bonus = entropy_loss(
            entropy_from_logits(predicting, settings.temperature), mask, settings.loss_agg_mode, **counts
        )
        loss = loss - settings.entropy_coef * bonus
        metrics[f"actor/entropy_loss{SHARE}"] = float(bonus.detach())
    if settings.positive_loss_coef or settings.topr_negative_loss_coef:
        extra, extra_metrics = score_split_loss(
            log_probs,
            old_log_probs,
            data["advantages"],
            mask,
            data["scores"] if "scores" in data.keys() else None,
            positive_coef=settings.positive_loss_coef,
            negative_coef=settings.topr_negative_loss_coef,
            loss_agg_mode=settings.loss_agg_mode,
            **counts,
        )
        loss = loss + extra
        metrics.update({f"actor/{k}{SHARE}": v for k, v in extra_metrics.items()})  # terms of the loss
    metrics[f"actor/total_loss{SHARE}"] = float(loss.detach())
    return loss, metrics


def _kl_loss(
    settings: ActorSettings, predicting: torch.Tensor, log_probs: torch.Tensor, micro: DataProto, counts: dict[str, Any]
) -> torch.Tensor:
    """The KL-to-reference loss term: a per-token estimator of the sampled tokens, or (penalty 'full') the exact KL
    between this forward's whole distribution and the reference's (``ref_full_log_probs``, (B, R, V))."""
    data = micro.batch
    if settings.kl_penalty == FULL_KL:
        per_token = full_kl(_log_softmax(predicting, settings.temperature), data["ref_full_log_probs"].detach())
        return aggregate_loss(per_token, data["response_mask"], settings.loss_agg_mode, **counts)
    return kl_loss(
        log_probs,
        data["ref_log_probs"],
        data["response_mask"],
        kind=settings.kl_penalty,
        loss_agg_mode=settings.loss_agg_mode,
        **counts,
    )


def opd_dense_loss(
    settings: ActorSettings, predicting: torch.Tensor, micro: DataProto, counts: dict[str, Any]
) -> torch.Tensor:
    """Dense OPD: the divergence between this forward's next-token distributions and the teacher's (its top-k, or
    the whole vocabulary) at every response position the teacher scored, aggregated as the policy loss is."""
    data = micro.batch
    if TEACHER_TOPK_LOG_PROBS not in data.keys():
        raise ConfigError(
            f"opd.dense_objective is set but the batch has no {TEACHER_TOPK_LOG_PROBS!r}: the teacher role must "
            f"run with dense_topk (RLVRConfig.teacher_settings)"
        )
    indices = data[TEACHER_TOPK_INDICES] if TEACHER_TOPK_INDICES in data.keys() else None
    per_token = opd_dense_divergence(
        predicting,
        data[TEACHER_TOPK_LOG_PROBS].detach(),
        indices,
        str(settings.opd_dense_objective),
        temperature=settings.temperature,
    )
    mask = data["response_mask"].float()
    if "teacher_rows" in data.keys():  # rows the (single) teacher did not score carry no distribution
        mask = mask * data["teacher_rows"].float()[:, None]
    return aggregate_loss(per_token, mask, settings.loss_agg_mode, **counts)


def policy_gradient_loss(
    settings: ActorSettings,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    micro: DataProto,
    counts: dict[str, Any],
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip (clip-higher, dual clip, GSPO) or one of ROLL's other pg_variants, with importance weights and
    ROLL's per-sample difficulty/length weights (these weigh the policy-gradient term only, as in ROLL)."""
    data = micro.batch
    is_weights = data["is_weights"] if "is_weights" in data.keys() else None
    if settings.difficulty_loss_weight or settings.length_loss_weight:
        weights = sample_loss_weights(
            data["response_lengths"],
            data["difficulty"] if "difficulty" in data.keys() else None,
            use_difficulty=settings.difficulty_loss_weight,
            use_length=settings.length_loss_weight,
        ).unsqueeze(-1)
        per_token = weights.expand_as(data["response_mask"]).to(torch.float32)
        is_weights = per_token if is_weights is None else is_weights * per_token
    if settings.pg_variant == "ppo":
        return policy_loss(
            log_probs,
            old_log_probs,
            data["advantages"],
            data["response_mask"],
            clip_low=settings.clip_low,
            clip_high=settings.clip_high,
            dual_clip=settings.dual_clip,
            ratio_level=settings.importance_sampling,
            loss_agg_mode=settings.loss_agg_mode,
            is_weights=is_weights,
            **counts,
        )
    return pg_variant_loss(
        settings.pg_variant,
        log_probs,
        old_log_probs,
        data["advantages"],
        data["response_mask"],
        scores=data["scores"] if "scores" in data.keys() else None,
        params=settings.pg_params,
        loss_agg_mode=settings.loss_agg_mode,
        is_weights=is_weights,
        **counts,
    )


class InferWorker(StrategyWorker):
    """actor_infer: samples responses with the rollout engine (no settings: sampling comes with each call)."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        """Left-padded prompts in; rows per the generation layout of roll.strategies.base out."""
        return self.strategy.generate(batch, generation_config)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def generate_requests(self, requests: list[GenerateRequest], policy_version: int) -> list[GenerateResult]:
        """One segment of each request (per-request generation, :mod:`roll.strategies.requests`), stamped with
        ``policy_version``, the weights the driver last synced into this engine."""
        pad = getattr(self.strategy.tokenizer, "pad_token_id", None) or 0
        return generate_requests(self.strategy, requests, pad_token_id=pad, policy_version=policy_version)


class _ScoringWorker(StrategyWorker):
    """Log-probs and entropy of sampled responses at the sampling temperature (``self.temperature``)."""

    temperature: float = 1.0
    full_distribution: bool = False
    dense_topk: int | None = None

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def compute_log_probs(self, batch: DataProto) -> DataProto:
        """``log_probs`` (B, R) of ``responses`` under the sampling temperature, and their ``entropy`` (B, R); with
        ``full_distribution`` (kl penalty 'full') also ``full_log_probs`` (B, R, V), the whole log-softmax; with
        ``dense_topk`` (a dense-OPD teacher) also ``topk_log_probs`` (B, R, k) renormalised over the top-k ids and
        ``topk_indices`` (B, R, k) int64 (k = 0: the whole log-softmax, (B, R, V), and no indices)."""
        length = _response_length(batch)
        temperature, full, topk = self.temperature, self.full_distribution, self.dense_topk

        def forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
            predicting = response_logits(logits, length)
            out = {
                "log_probs": log_probs_from_logits(predicting, micro.batch["responses"], temperature),
                "entropy": entropy_from_logits(predicting, temperature),
            }
            if full:
                _check_full_distribution_size(len(batch), length, predicting.shape[-1])
                out["full_log_probs"] = _log_softmax(predicting, temperature)
            if topk is not None:
                if topk == 0:
                    _check_full_distribution_size(len(batch), length, predicting.shape[-1])
                top = teacher_topk(predicting, topk, temperature)
                out["topk_log_probs"] = top.log_probs
                if top.indices is not None:
                    out["topk_indices"] = top.indices
            return out

        out = self.strategy.forward_step(batch, forward, logits_to_keep=_logits_to_keep(length))
        return DataProto.from_dict(dict(out))


class PolicyWorker(_ScoringWorker):
    """A policy that scores responses: the reference. ``initialize(settings)`` takes :class:`PolicySettings`."""

    settings: PolicySettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: PolicySettings | None = None) -> None:
        settings = settings or PolicySettings()
        self.temperature = settings.temperature
        self.full_distribution = settings.full_distribution
        self.dense_topk = settings.dense_topk
        super().initialize(settings)


class ActorWorker(_ScoringWorker):
    """actor_train: PPO-family policy updates (PPO-clip, clip-higher, dual clip, GSPO, KL loss, entropy, TIS).

    ``initialize(settings)`` takes :class:`ActorSettings`.
    """

    settings: ActorSettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: ActorSettings | None = None) -> None:
        settings = settings or ActorSettings()
        self.temperature = settings.temperature
        self.full_distribution = settings.full_distribution
        super().initialize(settings)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(
        self, batch: DataProto, plan: UpdatePlan, old_log_probs_from_train_forward: bool = False
    ) -> DataProto:
        """Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``response_mask`` (loss mask),
        ``old_log_probs`` (unless ``old_log_probs_from_train_forward``: one on-policy step, whose loss takes its own
        detached log-probs as the old ones), ``advantages`` (all (B, R) except the first three), optionally
        ``ref_log_probs`` and ``is_weights``. Runs ``plan.epochs`` x ``plan.num_mini_batches`` optimizer steps."""
        keep = _logits_to_keep(_response_length(batch))

        def loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
            return actor_loss(self.settings, micro, logits, scale, on_policy=old_log_probs_from_train_forward)

        def step(mini: DataProto) -> dict[str, float]:
            return self.train_strategy.train_step(mini, loss, loss_mask_key="response_mask", logits_to_keep=keep)

        return DataProto(meta_info={"metrics": run_update(batch, plan, self.rank_info.dp_rank, step, prefix="actor")})


class CriticWorker(StrategyWorker):
    """critic: a value model (model_args.model_head: value) trained with clipped value loss.

    ``initialize(settings)`` takes :class:`CriticSettings`.
    """

    settings: CriticSettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: CriticSettings | None = None) -> None:
        super().initialize(settings or CriticSettings())

    @staticmethod
    def _values(logits: torch.Tensor, length: int) -> torch.Tensor:
        # The value of the state before response token t sits at the position that predicts t.
        return response_logits(logits, length)[..., 0]

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def compute_values(self, batch: DataProto) -> DataProto:
        """``values`` (B, R)."""
        length = _response_length(batch)
        out = self.strategy.forward_step(
            batch,
            lambda micro, logits: {"values": self._values(logits, length)},
            logits_to_keep=_logits_to_keep(length),
        )
        return DataProto.from_dict({"values": out["values"]})

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto, plan: UpdatePlan) -> DataProto:
        """Needs ``responses``, ``response_mask``, ``values`` (old), ``returns``; the schedule as ActorWorker's."""
        length = _response_length(batch)
        clip = self.settings.value_clip

        def loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
            data = micro.batch
            value, metrics = value_loss(
                self._values(logits, length),
                data["values"],
                data["returns"],
                data["response_mask"],
                clip=clip,
                loss_agg_mode="token-mean",
                num_tokens=scale.num_tokens,
                num_seqs=scale.num_seqs,
            )
            return value, {f"critic/{k}": v for k, v in metrics.items()}

        def step(mini: DataProto) -> dict[str, float]:
            return self.train_strategy.train_step(
                mini, loss, loss_mask_key="response_mask", logits_to_keep=_logits_to_keep(length)
            )

        return DataProto(meta_info={"metrics": run_update(batch, plan, self.rank_info.dp_rank, step, prefix="critic")})
