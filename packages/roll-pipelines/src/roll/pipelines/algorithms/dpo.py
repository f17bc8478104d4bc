"""Direct Preference Optimisation losses (Rafailov et al., 2023) and the IPO variant (Azar et al., 2023)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roll.pipelines.algorithms._masked import masked_sum
from roll.pipelines.algorithms._validation import check_1d, check_2d, check_choice, check_positive, check_same_shape
from roll.runtime.errors import ConfigError

__all__ = ["DPO_LOSS_TYPES", "dpo_loss", "sequence_log_probs"]

DPO_LOSS_TYPES = ("sigmoid", "ipo")


def sequence_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probability of each response: the sum of its token log-probs over ``mask``.

    Args:
        token_log_probs: (batch, response_len), differentiable.
        mask: (batch, response_len), bool or float.

    Returns:
        (batch,) summed log-probs.
    """
    check_2d("token_log_probs", token_log_probs)
    return masked_sum(token_log_probs, mask, dim=-1)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO loss from per-sequence summed log-probs (see :func:`sequence_log_probs`).

    With ``logits = (pc - pr) - (rc - rr)``:

    * ``"sigmoid"``: ``-(1 - ls) * logsigmoid(beta * logits) - ls * logsigmoid(-beta * logits)``, where
      ``ls = label_smoothing`` in ``[0, 0.5]`` models that a fraction of preference labels is flipped (cDPO);
    * ``"ipo"``: ``(logits - 1 / (2 * beta))^2`` (``label_smoothing`` must be 0).

    Args:
        policy_chosen_logps, policy_rejected_logps: (batch,), differentiable.
        ref_chosen_logps, ref_rejected_logps: (batch,), treated as constants.
        beta: inverse temperature of the implicit reward (> 0).

    Returns:
        ``(losses, chosen_rewards, rejected_rewards)``, each (batch,); the rewards
        ``beta * (policy - ref)`` are detached. Reduce ``losses`` with ``.mean()``.
    """
    check_choice("loss_type", loss_type, DPO_LOSS_TYPES)
    beta = check_positive("beta", beta)
    label_smoothing = check_positive("label_smoothing", label_smoothing, allow_zero=True)
    if label_smoothing > 0.5:
        raise ConfigError(f"label_smoothing={label_smoothing!r} is not valid; it must be in [0, 0.5]")
    if loss_type == "ipo" and label_smoothing != 0:
        raise ConfigError(
            f"label_smoothing={label_smoothing!r} is only used by loss_type='sigmoid'; set it to 0 for 'ipo'"
        )
    check_1d("policy_chosen_logps", policy_chosen_logps)
    check_same_shape(
        "policy_chosen_logps",
        policy_chosen_logps,
        policy_rejected_logps=policy_rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
    )
    ref_chosen, ref_rejected = ref_chosen_logps.detach(), ref_rejected_logps.detach()
    logits = (policy_chosen_logps - policy_rejected_logps) - (ref_chosen - ref_rejected)
    if loss_type == "sigmoid":
        losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(-beta * logits)
    else:
        losses = (logits - 1.0 / (2.0 * beta)).square()
    chosen_rewards = beta * (policy_chosen_logps - ref_chosen).detach()
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected).detach()
    return losses, chosen_rewards, rejected_rewards
