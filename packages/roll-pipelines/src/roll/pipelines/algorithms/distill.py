"""Knowledge-distillation maths: the teacher's top-k distribution, the divergences between student and teacher,
the masked KD loss, and the on-policy-distillation (OPD) advantage.

Top-k and the tail (as ROLL does it): the teacher's logits are divided by its temperature, the ``k`` largest
are kept and renormalised with a softmax over those ``k`` alone (the tail's mass is dropped, not lumped into an
extra bucket). The student's logits are gathered at the teacher's ``k`` token ids and renormalised over the same
``k`` ids, so both distributions live on the teacher's support. ``k = 0`` keeps the whole vocabulary.

A teacher entry whose logit is ``-inf`` (a masked vocabulary slot, or ``k`` larger than the unmasked vocabulary)
has log-probability ``-inf``; it and any ``-inf`` student entry contribute 0 to every divergence.

Divergences, per token, with teacher ``p``, student ``q`` (both over the ``k`` ids):

* ``forward_kl``: ``sum p (log p - log q)``;
* ``reverse_kl``: ``sum q (log q - log p)``;
* ``skewed_forward_kl``: ``sum p (log p - log(lam p + (1 - lam) q))``;
* ``skewed_reverse_kl``: ``sum q (log q - log((1 - lam) p + lam q))``;
* ``js_divergence``: ``(KL(p || m) + KL(q || m)) / 2`` with ``m = (p + q) / 2``;
* ``adaptive_kl``: ``(g_head fkl + g_tail rkl) / (g_head + g_tail)``, where, with the teacher's ids sorted by
  ascending ``p``, the tail is the ids whose cumulative ``p`` is ``<= alpha`` and ``g`` sums ``|p - q|`` over
  head or tail (the weights carry no gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from roll.pipelines.algorithms._validation import check_choice, check_positive, check_same_shape
from roll.pipelines.algorithms.kl import kl_penalty
from roll.runtime.errors import ConfigError

__all__ = [
    "KD_OBJECTIVES",
    "TeacherTopK",
    "gather_student_logits",
    "kd_divergence",
    "kd_loss",
    "opd_advantages",
    "opd_dense_divergence",
    "teacher_topk",
]

KD_OBJECTIVES = (
    "forward_kl",
    "reverse_kl",
    "adaptive_kl",
    "skewed_forward_kl",
    "skewed_reverse_kl",
    "js_divergence",
)


class TeacherTopK(NamedTuple):
    """The teacher's renormalised top-k: ``log_probs`` (..., k) and ``indices`` (..., k) int64, or None for the
    whole vocabulary (``k = 0``)."""

    log_probs: torch.Tensor
    indices: torch.Tensor | None


def teacher_topk(logits: torch.Tensor, k: int, temperature: float = 1.0) -> TeacherTopK:
    """Temperature-scaled top-``k`` log-probabilities of ``logits`` (..., V), renormalised over the ``k`` ids."""
    check_positive("temperature", temperature)
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ConfigError(f"logits_topk={k!r} is not valid; use 0 (whole vocabulary) or a positive number of ids")
    scaled = logits.float() / temperature
    if k == 0 or k >= scaled.shape[-1]:
        if k > scaled.shape[-1]:
            raise ConfigError(f"logits_topk={k} exceeds the vocabulary ({scaled.shape[-1]} ids); lower it or use 0")
        return TeacherTopK(torch.log_softmax(scaled, dim=-1), None if k == 0 else _all_ids(scaled))
    values, indices = torch.topk(scaled, k, dim=-1)
    return TeacherTopK(torch.log_softmax(values, dim=-1), indices)


def _all_ids(logits: torch.Tensor) -> torch.Tensor:
    ids = torch.arange(logits.shape[-1], device=logits.device)
    return ids.expand(logits.shape).contiguous()


def gather_student_logits(logits: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    """The student's logits (..., V) at the teacher's ids (..., k); all of them when ``indices`` is None."""
    if indices is None:
        return logits
    return torch.gather(logits, -1, indices.long())


def _masked_sum(terms: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
    return terms.masked_fill(invalid, 0.0).sum(-1)


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp(min=torch.finfo(x.dtype).tiny))


def _plogp_ratio(p: torch.Tensor, log_p: torch.Tensor, log_r: torch.Tensor) -> torch.Tensor:
    """``p * (log_p - log_r)``, 0 wherever ``p`` is 0 (no ``0 * inf``)."""
    return torch.where(p > 0, p * (log_p - log_r), torch.zeros_like(p))


def _forward(
    p: torch.Tensor, log_p: torch.Tensor, q: torch.Tensor, log_q: torch.Tensor, bad: torch.Tensor, **_: float
) -> torch.Tensor:
    return _masked_sum(_plogp_ratio(p, log_p, log_q), bad)


def _reverse(
    p: torch.Tensor, log_p: torch.Tensor, q: torch.Tensor, log_q: torch.Tensor, bad: torch.Tensor, **_: float
) -> torch.Tensor:
    return _masked_sum(_plogp_ratio(q, log_q, log_p), bad)


def _skewed_forward(
    p: torch.Tensor,
    log_p: torch.Tensor,
    q: torch.Tensor,
    log_q: torch.Tensor,
    bad: torch.Tensor,
    *,
    skew_lambda: float,
    **_: float,
) -> torch.Tensor:
    mixed = skew_lambda * p + (1 - skew_lambda) * q
    return _masked_sum(_plogp_ratio(p, log_p, _safe_log(mixed)), bad)


def _skewed_reverse(
    p: torch.Tensor,
    log_p: torch.Tensor,
    q: torch.Tensor,
    log_q: torch.Tensor,
    bad: torch.Tensor,
    *,
    skew_lambda: float,
    **_: float,
) -> torch.Tensor:
    mixed = (1 - skew_lambda) * p + skew_lambda * q
    return _masked_sum(_plogp_ratio(q, log_q, _safe_log(mixed)), bad)


def _js(
    p: torch.Tensor, log_p: torch.Tensor, q: torch.Tensor, log_q: torch.Tensor, bad: torch.Tensor, **_: float
) -> torch.Tensor:
    log_m = _safe_log((p + q) / 2)
    return _masked_sum((_plogp_ratio(p, log_p, log_m) + _plogp_ratio(q, log_q, log_m)) / 2, bad)


def _adaptive(
    p: torch.Tensor,
    log_p: torch.Tensor,
    q: torch.Tensor,
    log_q: torch.Tensor,
    bad: torch.Tensor,
    *,
    adaptive_alpha: float,
    **_: float,
) -> torch.Tensor:
    sorted_p, order = p.sort(dim=-1)
    gap = (sorted_p - q.gather(-1, order)).abs()
    tail = sorted_p.cumsum(-1) <= adaptive_alpha
    g_head = gap.masked_fill(tail, 0.0).sum(-1).detach()
    g_tail = gap.masked_fill(~tail, 0.0).sum(-1).detach()
    total = (g_head + g_tail).clamp(min=torch.finfo(p.dtype).tiny)
    fkl, rkl = _forward(p, log_p, q, log_q, bad), _reverse(p, log_p, q, log_q, bad)
    return (g_head / total) * fkl + (g_tail / total) * rkl


_DIVERGENCES: dict[str, Callable[..., torch.Tensor]] = {
    "forward_kl": _forward,
    "reverse_kl": _reverse,
    "adaptive_kl": _adaptive,
    "skewed_forward_kl": _skewed_forward,
    "skewed_reverse_kl": _skewed_reverse,
    "js_divergence": _js,
}


def kd_divergence(
    student_logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    objective: str = "forward_kl",
    *,
    temperature: float = 1.0,
    skew_lambda: float = 0.1,
    adaptive_alpha: float = 0.5,
) -> torch.Tensor:
    """Per-token divergence (...,) between the student and the teacher on the teacher's support.

    ``student_logits`` (..., k): the student's logits at the teacher's ids (:func:`gather_student_logits`);
    ``teacher_log_probs`` (..., k): :func:`teacher_topk`'s. The student is scaled by ``temperature`` (the KD
    temperature) and renormalised over the ``k`` ids.
    """
    check_choice("kd_objective", objective, KD_OBJECTIVES)
    check_positive("kd_temperature", temperature)
    if not 0.0 <= skew_lambda <= 1.0:
        raise ConfigError(f"skew_lambda={skew_lambda!r} is not valid; it must lie in [0, 1]")
    if not 0.0 <= adaptive_alpha <= 1.0:
        raise ConfigError(f"adaptive_kl_alpha={adaptive_alpha!r} is not valid; it must lie in [0, 1]")
    check_same_shape("student_logits", student_logits, teacher_log_probs=teacher_log_probs)
    scaled = student_logits.float() / temperature
    log_q = torch.log_softmax(scaled, dim=-1)
    log_p = teacher_log_probs.float()
    bad = torch.isinf(scaled) | torch.isinf(log_p)
    # Masked entries become (p, log p) = (0, 0): every term below is finite and so are the gradients.
    log_p, log_q = log_p.masked_fill(bad, 0.0), log_q.masked_fill(bad, 0.0)
    p, q = log_p.exp().masked_fill(bad, 0.0), log_q.exp().masked_fill(bad, 0.0)
    return _DIVERGENCES[objective](p, log_p, q, log_q, bad, skew_lambda=skew_lambda, adaptive_alpha=adaptive_alpha)


def kd_loss(per_token: torch.Tensor, mask: torch.Tensor, num_tokens: int | None = None) -> torch.Tensor:
    """Masked token sum of ``per_token`` divided by ``num_tokens`` (default: this batch's unmasked tokens)."""
    check_same_shape("per_token", per_token, mask=mask)
    weights = mask.to(per_token.dtype)
    denominator = float(num_tokens) if num_tokens is not None else weights.sum().clamp(min=1)
    return (per_token * weights).sum() / denominator


def opd_advantages(
    log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float = 1.0,
    penalty: str = "k1",
) -> torch.Tensor:
    """On-policy distillation: per-token ``-coef * KL_estimate(student || teacher)`` on the student's samples,
    0 on masked tokens. With ``k1`` it is ``-coef * (log p_student - log p_teacher)`` (reverse KL)."""
    check_positive("opd_kl_coef", coef, allow_zero=True)
    kl = kl_penalty(log_probs, teacher_log_probs, penalty)
    return -coef * kl * response_mask.to(kl.dtype)


def opd_dense_divergence(
    student_logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    teacher_indices: torch.Tensor | None,
    objective: str = "forward_kl",
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Dense on-policy distillation: per position (..., ) the divergence between the student's and the teacher's
    whole next-token distributions at the student's own sampled positions (GKD-style on-policy distillation).

    ``student_logits`` (..., V): the student's raw logits predicting each sampled response token;
    ``teacher_log_probs`` (..., k) and ``teacher_indices`` (..., k) (None: the whole vocabulary, k = V): the
    teacher's :func:`teacher_topk` at the same positions and the same temperature. The student is scaled by
    ``temperature`` and renormalised over the teacher's ids, so the divergence is the top-k one of
    :func:`kd_divergence` (exact over the vocabulary when ``teacher_indices`` is None). Unlike the sampled-token
    estimator of :func:`opd_advantages`, every token of the teacher's support gets a gradient, including the
    teacher's choice when the student sampled another token.
    """
    gathered = gather_student_logits(student_logits, teacher_indices)
    return kd_divergence(gathered, teacher_log_probs, objective, temperature=temperature)
