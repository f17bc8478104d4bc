"""The SFT role: next-token loss on the target tokens (``labels`` != -100), normalized over the mini-batch."""

from __future__ import annotations

import torch

from roll.pipelines.workers import LogProbWorker
from roll.protocol import DataProto, Dispatch, register
from roll.strategies import LossScale
from roll.strategies.ops import language_model_loss

__all__ = ["SFTWorker", "sft_loss"]


def sft_loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean cross-entropy of ``labels``: the micro-batch's share of the mini-batch loss."""
    loss, _ = language_model_loss(logits, micro.batch["labels"], num_tokens=scale.num_tokens)
    return loss, {}


class SFTWorker(LogProbWorker):
    """sft_train: one optimizer step per batch; no settings of its own (``initialize()`` takes none)."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_step(self, batch: DataProto) -> DataProto:
        """Needs ``input_ids``, ``attention_mask``, ``labels`` and ``loss_mask`` (the target tokens)."""
        metrics = self.train_strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")
        return DataProto(meta_info={"metrics": metrics})
