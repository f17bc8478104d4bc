"""The model roles of RLVR: rollout engine, policy (log-probs and PPO-family updates), reference, critic.

Losses are algorithm maths from :mod:`roll.pipelines.algorithms`; strategies only run them. Each role's
batch fields are listed in the method docstrings (producer and consumers agree on name, dtype and shape).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roll.pipelines.algorithms import entropy_loss, kl_loss, masked_mean, policy_loss, value_loss
from roll.protocol import DataProto, Dispatch, register
from roll.strategies import GenerationConfig, LossScale, StrategyWorker
from roll.strategies.ops import entropy_from_logits, log_probs_from_logits, response_logits

__all__ = ["ActorWorker", "CriticWorker", "InferWorker", "PolicyWorker"]


def _temperature(config: Any) -> float:
    temperature = config.actor_infer.generating_args.temperature
    return temperature if temperature > 0 else 1.0


def _mini_batches(batch: DataProto, count: int, seed: int, epoch: int, rank: int) -> list[DataProto]:
    """``count`` shuffled parts of the local shard; every rank makes the same number of optimizer steps."""
    order = np.random.default_rng([seed, epoch, rank]).permutation(len(batch))
    return [batch.select_idxs(part) for part in np.array_split(order, count)]


def _response_length(batch: DataProto) -> int:
    return batch.batch["responses"].shape[1]


def _logits_to_keep(length: int) -> int:
    """The positions ``response_logits`` reads: the last prompt token predicts the first response token."""
    return length + 1


class InferWorker(StrategyWorker):
    """actor_infer: samples responses with the rollout engine."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def generate(self, batch: DataProto, generation_config: GenerationConfig) -> DataProto:
        """Left-padded prompts in; rows per the generation layout of roll.strategies.base out."""
        return self.strategy.generate(batch, generation_config)


class PolicyWorker(StrategyWorker):
    """A policy that scores responses: the reference, and the base of the trained actor."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def compute_log_probs(self, batch: DataProto) -> DataProto:
        """``log_probs`` (B, R) of ``responses`` under the sampling temperature, and their ``entropy`` (B, R)."""
        length = _response_length(batch)
        temperature = _temperature(self.settings)

        def forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
            predicting = response_logits(logits, length)
            return {
                "log_probs": log_probs_from_logits(predicting, micro.batch["responses"], temperature),
                "entropy": entropy_from_logits(predicting, temperature),
            }

        out = self.strategy.forward_step(batch, forward, logits_to_keep=_logits_to_keep(length))
        return DataProto.from_dict({"log_probs": out["log_probs"], "entropy": out["entropy"]})


class ActorWorker(PolicyWorker):
    """actor_train: PPO-family policy updates (PPO-clip, clip-higher, dual clip, GSPO, KL loss, entropy, TIS)."""

    def _loss(self, micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.settings
        data = micro.batch
        predicting = response_logits(logits, data["responses"].shape[1])
        log_probs = log_probs_from_logits(predicting, data["responses"], _temperature(cfg))
        mask = data["response_mask"]
        counts = {"num_tokens": scale.num_tokens, "num_seqs": scale.num_seqs}
        # One on-policy update without a recompute pass: this forward is the old policy (see RLVRConfig).
        on_policy = micro.meta_info.get("old_log_probs_from_train_forward", False)
        loss, metrics = policy_loss(
            log_probs,
            log_probs.detach() if on_policy else data["old_log_probs"],
            data["advantages"],
            mask,
            clip_low=cfg.pg_clip_low or cfg.pg_clip,
            clip_high=cfg.pg_clip_high or cfg.pg_clip,
            dual_clip=cfg.dual_clip_loss,
            ratio_level=cfg.importance_sampling,
            loss_agg_mode=cfg.loss_agg_mode,
            is_weights=data["is_weights"] if "is_weights" in data.keys() else None,
            **counts,
        )
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        metrics["actor/pg_loss"] = float(loss.detach())
        if on_policy:  # the recompute pass would have reported it
            with torch.no_grad():
                entropy = entropy_from_logits(predicting, _temperature(cfg))
                metrics["actor/entropy"] = float(masked_mean(entropy, mask))
        if cfg.use_kl_loss and cfg.kl_loss_coef > 0:
            kl = kl_loss(
                log_probs, data["ref_log_probs"], mask, kind=cfg.kl_penalty, loss_agg_mode=cfg.loss_agg_mode, **counts
            )
            loss = loss + cfg.kl_loss_coef * kl
            metrics["actor/kl_loss"] = float(kl.detach())
        if cfg.entropy_loss_coef > 0:
            entropy = entropy_loss(
                entropy_from_logits(predicting, _temperature(cfg)), mask, cfg.loss_agg_mode, **counts
            )
            loss = loss - cfg.entropy_loss_coef * entropy
            metrics["actor/entropy_loss"] = float(entropy.detach())
        return loss, metrics

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto) -> DataProto:
        """Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``, ``response_mask`` (loss mask),
        ``old_log_probs``, ``advantages`` (all (B, R) except the first three), optionally ``ref_log_probs`` and
        ``is_weights``; ``meta_info``: ``num_mini_batches``, ``seed``, and ``old_log_probs_from_train_forward``
        (one on-policy step: the loss takes its own detached log-probs as the old ones). Runs ``ppo_epochs`` x
        mini-batches steps."""
        cfg = self.settings
        keep = _logits_to_keep(_response_length(batch))
        metrics: dict[str, list[float]] = {}
        for epoch in range(cfg.ppo_epochs):
            for mini in _mini_batches(
                batch, batch.meta_info["num_mini_batches"], batch.meta_info["seed"], epoch, self.rank
            ):
                step = self.train_strategy.train_step(
                    mini, self._loss, loss_mask_key="response_mask", logits_to_keep=keep
                )
                for key, value in step.items():
                    metrics.setdefault(key if "/" in key else f"actor/{key}", []).append(value)
        return DataProto(meta_info={"metrics": metrics})


class CriticWorker(StrategyWorker):
    """critic: a value model (model_args.model_head: value) trained with clipped value loss."""

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
    def train_step(self, batch: DataProto) -> DataProto:
        """Needs ``responses``, ``response_mask``, ``values`` (old), ``returns``; meta as ActorWorker.train_step."""
        cfg = self.settings
        length = _response_length(batch)

        def loss_func(
            micro: DataProto, logits: torch.Tensor, scale: LossScale
        ) -> tuple[torch.Tensor, dict[str, float]]:
            data = micro.batch
            loss, metrics = value_loss(
                self._values(logits, length),
                data["values"],
                data["returns"],
                data["response_mask"],
                clip=cfg.value_clip,
                loss_agg_mode="token-mean",
                num_tokens=scale.num_tokens,
                num_seqs=scale.num_seqs,
            )
            return loss, {f"critic/{k}": v for k, v in metrics.items()}

        metrics: dict[str, list[float]] = {}
        for epoch in range(cfg.ppo_epochs):
            for mini in _mini_batches(
                batch, batch.meta_info["num_mini_batches"], batch.meta_info["seed"], epoch, self.rank
            ):
                step = self.train_strategy.train_step(
                    mini, loss_func, loss_mask_key="response_mask", logits_to_keep=_logits_to_keep(length)
                )
                for key, value in step.items():
                    metrics.setdefault(key if "/" in key else f"critic/{key}", []).append(value)
        return DataProto(meta_info={"metrics": metrics})
