"""The DPO role: the preference loss on chosen/rejected pairs laid out as consecutive rows."""

from __future__ import annotations

import torch

from roll.pipelines.algorithms import dpo_loss
from roll.pipelines.dpo.config import DPOLossSection
from roll.pipelines.workers import LogProbWorker
from roll.pipelines.workers.logprob import sequence_log_prob_forward
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.strategies import LossScale

__all__ = ["DPOWorker", "dpo_metrics"]


# Margins this close to 0 are ties: the policy and the reference compute the same log-probs up to rounding.
TIE_TOLERANCE = 1e-6


def dpo_metrics(policy: torch.Tensor, reference: torch.Tensor, beta: float, prefix: str) -> dict[str, float]:
    """Accuracy, ties and reward statistics of pairs laid out as rows (chosen, rejected, ...).

    ``accuracy`` is the share of pairs whose chosen response has the strictly higher implicit reward; ``ties``
    (|margin| <= TIE_TOLERANCE, e.g. every pair while the policy equals the reference) count as not preferred.
    """
    chosen = beta * (policy[0::2] - reference[0::2])
    rejected = beta * (policy[1::2] - reference[1::2])
    margin = chosen - rejected
    tie = margin.abs() <= TIE_TOLERANCE
    return {
        f"{prefix}accuracy": float(((margin > 0) & ~tie).float().mean()),
        f"{prefix}ties": float(tie.float().mean()),
        f"{prefix}rewards/chosen": float(chosen.mean()),
        f"{prefix}rewards/rejected": float(rejected.mean()),
        f"{prefix}rewards/margin": float(margin.mean()),
    }


class DPOWorker(LogProbWorker):
    """actor_train of DPO; ``initialize(settings)`` takes the config's ``loss`` section."""

    settings: DPOLossSection

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: DPOLossSection | None = None) -> None:
        super().initialize(settings or DPOLossSection())

    def _loss(self, micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
        loss = self.settings
        policy = sequence_log_prob_forward()(micro, logits)["seq_log_prob"]
        reference = micro.batch["ref_seq_log_prob"]
        losses, _, _ = dpo_loss(
            policy[0::2],
            policy[1::2],
            reference[0::2],
            reference[1::2],
            beta=loss.beta,
            label_smoothing=loss.label_smoothing,
            loss_type=loss.loss_type,
        )
        pairs = scale.num_seqs / 2
        return losses.sum() / pairs, dpo_metrics(policy.detach(), reference, loss.beta, "train/")

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto) -> DataProto:
        """Needs the pairs' ``input_ids``, ``attention_mask``, ``loss_mask`` and ``ref_seq_log_prob``."""
        if len(batch) % 2:
            raise ConfigError(f"{self.worker_name} got {len(batch)} rows: DPO batches must hold whole pairs")
        metrics = self.train_strategy.train_step(batch, self._loss, loss_mask_key="loss_mask")
        return DataProto(meta_info={"metrics": metrics})
