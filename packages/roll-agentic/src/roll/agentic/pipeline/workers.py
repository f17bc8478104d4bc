"""actor_train of the agentic pipeline: RLVR's ActorWorker with ROLL's ``ratio_type`` (token or segment ratios).

``ratio_type: segment`` takes one importance ratio per assistant turn: the mean log-ratio over the turn's tokens
(:func:`~roll.pipelines.algorithms.segment_masked_mean`), exponentiated, with gradients flowing to every token of
the turn. Everything else (clipping, KL loss, dense OPD's term, entropy bonus, update schedule) is RLVR's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from roll.pipelines.algorithms import entropy_loss, kl_loss, masked_mean, segment_masked_mean
from roll.pipelines.rlvr.settings import ActorSettings
from roll.pipelines.rlvr.workers import ActorWorker, opd_dense_loss, policy_gradient_loss
from roll.pipelines.stages import UpdatePlan, run_update
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.strategies import SHARE, LossScale
from roll.strategies.ops import entropy_from_logits, log_probs_from_logits, response_logits

__all__ = ["AgenticActorSettings", "AgenticActorWorker", "agentic_actor_loss"]


@dataclass(frozen=True)
class AgenticActorSettings(ActorSettings):
    """RLVR's actor settings plus ``ratio_type`` (token | segment)."""

    ratio_type: Literal["token", "segment"] = "token"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_type not in ("token", "segment"):
            raise ConfigError(f"AgenticActorSettings.ratio_type must be 'token' or 'segment', got {self.ratio_type!r}")


def agentic_actor_loss(
    settings: AgenticActorSettings, micro: DataProto, logits: torch.Tensor, scale: LossScale, *, on_policy: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss of one micro-batch with token or segment ratios, + KL loss (+ dense OPD's divergence to the
    teacher) - entropy bonus."""
    data = micro.batch
    predicting = response_logits(logits, data["responses"].shape[1])
    log_probs = log_probs_from_logits(predicting, data["responses"], settings.temperature)
    mask = data["response_mask"]
    old = log_probs.detach() if on_policy else data["old_log_probs"]
    ratio_log_probs = log_probs
    if settings.ratio_type == "segment":  # one ratio per assistant turn, its gradient spread over the turn
        ratio_log_probs = old + segment_masked_mean(log_probs - old, mask)
    tokens, seqs = scale.num_tokens, scale.num_seqs
    # RLVR's policy-gradient term (PPO-clip or ROLL's pg_variants, importance and per-sample weights) on these ratios.
    loss, metrics = policy_gradient_loss(
        settings, ratio_log_probs, old, micro, {"num_tokens": tokens, "num_seqs": seqs}
    )
    metrics = {f"actor/{k}": v for k, v in metrics.items()}
    metrics[f"actor/pg_loss{SHARE}"] = float(loss.detach())
    entropy = entropy_from_logits(predicting, settings.temperature)
    metrics["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
    metrics["actor/log_prob"] = float(masked_mean(log_probs.detach(), mask))  # warm-up: minus the NLL
    if settings.kl_loss_on:
        kl = kl_loss(
            log_probs,
            data["ref_log_probs"],
            mask,
            kind=settings.kl_penalty,
            loss_agg_mode=settings.loss_agg_mode,
            num_tokens=tokens,
            num_seqs=seqs,
        )
        loss = loss + settings.kl_loss_coef * kl
        metrics[f"actor/kl_loss{SHARE}"] = float(kl.detach())
    if settings.opd_dense_objective is not None:  # roll's dense OPD: the teacher's distributions at every position
        dense = opd_dense_loss(settings, predicting, micro, {"num_tokens": tokens, "num_seqs": seqs})
        loss = loss + settings.opd_dense_coef * dense
        metrics[f"actor/opd_dense_loss{SHARE}"] = float(dense.detach())
    if settings.entropy_coef > 0:
        bonus = entropy_loss(entropy, mask, settings.loss_agg_mode, num_tokens=tokens, num_seqs=seqs)
        loss = loss - settings.entropy_coef * bonus
        metrics[f"actor/entropy_loss{SHARE}"] = float(bonus.detach())
    return loss, metrics


class AgenticActorWorker(ActorWorker):
    """actor_train; ``initialize(settings)`` takes :class:`AgenticActorSettings`."""

    settings: AgenticActorSettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: AgenticActorSettings | None = None) -> None:  # type: ignore[override]
        super().initialize(settings or AgenticActorSettings())

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(
        self,
        batch: DataProto,
        plan: UpdatePlan,
        old_log_probs_from_train_forward: bool = False,
        behaviour_cloning: bool = False,
    ) -> DataProto:
        """As :meth:`ActorWorker.train_step`, with the loss of :func:`agentic_actor_loss`. ``behaviour_cloning``
        (the warm-up; advantages 1 on the expert's tokens): the token-mean negative log-likelihood at the sampling
        temperature, whatever the RL loss settings are (aggregation, pg variant, entropy bonus, KL to the reference),
        so changing the RL loss leaves the warm-up, and a cached warm-up, as they were."""
        keep = batch.batch["responses"].shape[1] + 1
        settings = self.settings
        if behaviour_cloning:  # the default loss at ratio 1: the NLL's gradient, at the sampling temperature
            settings = AgenticActorSettings(temperature=settings.temperature)
            old_log_probs_from_train_forward = True

        def loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
            return agentic_actor_loss(settings, micro, logits, scale, on_policy=old_log_probs_from_train_forward)

        def step(mini: DataProto) -> dict[str, float]:
            return self.train_strategy.train_step(mini, loss, loss_mask_key="response_mask", logits_to_keep=keep)

        return DataProto(meta_info={"metrics": run_update(batch, plan, self.rank_info.dp_rank, step, prefix="actor")})
