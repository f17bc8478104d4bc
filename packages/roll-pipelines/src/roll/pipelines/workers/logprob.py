"""Log-probability computations on a model role (reference, actor, teacher...), backend-independent."""

from __future__ import annotations

import torch

from roll.pipelines.workers.generation import greedy_decode
from roll.protocol import DataProto, Dispatch, register
from roll.strategies import StrategyWorker
from roll.strategies.ops import log_probs_from_logits

__all__ = ["LogProbWorker", "sequence_log_prob_forward"]


def _target_log_probs(micro: DataProto, logits: torch.Tensor, mask_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log p(token t | prefix) for t >= 1 and the target mask, both (b, T-1)."""
    input_ids = micro.batch["input_ids"]
    log_probs = log_probs_from_logits(logits[:, :-1], input_ids[:, 1:])
    mask = micro.batch[mask_key][:, 1:].bool()
    return log_probs, mask


def sequence_log_prob_forward(mask_key: str = "loss_mask"):
    """forward_func giving each row's summed log-prob over its target tokens and the target count."""

    def forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        log_probs, mask = _target_log_probs(micro, logits, mask_key)
        return {"seq_log_prob": (log_probs * mask).sum(-1), "num_target_tokens": mask.sum(-1)}

    return forward


class LogProbWorker(StrategyWorker):
    """A role that scores sequences: summed log-probs of target tokens (``loss_mask``) per row."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def compute_sequence_log_probs(self, batch: DataProto) -> DataProto:
        out = self.strategy.forward_step(batch, sequence_log_prob_forward())
        return DataProto.from_dict({"seq_log_prob": out["seq_log_prob"], "num_target_tokens": out["num_target_tokens"]})

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def generate_greedy(self, batch: DataProto, max_new_tokens: int) -> DataProto:
        """Greedy answers to left-padded prompts by forward passes (see :func:`greedy_decode`)."""
        tokenizer = self.strategy.tokenizer
        return greedy_decode(
            self.strategy,
            batch,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
