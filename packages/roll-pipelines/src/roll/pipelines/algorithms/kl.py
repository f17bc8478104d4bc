"""Per-token KL estimators between the policy and the reference model, and KL-coefficient controllers.

The estimators follow J. Schulman's "Approximating KL Divergence" note, with samples drawn from the policy:
with ``d = log_probs - ref_log_probs``,

* ``k1`` (alias ``kl``): ``d`` — unbiased, high variance, can be negative per token;
* ``abs``: ``|d|``;
* ``k2`` (alias ``mse``): ``0.5 * d**2`` — biased, low variance, its gradient is that of the true KL;
* ``k3`` (alias ``low_var_kl``): ``exp(-d) + d - 1`` — unbiased, non-negative, low variance.

``full`` (ROLL's ``kl_penalty: full``, "the actual KL for all tokens in the distribution") is not an estimator of
sampled tokens: :func:`full_kl` takes both models' whole log-softmax distributions per position and returns the
exact ``KL(policy || reference) = sum_v p(v) * (log p(v) - log q(v))`` per token.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from roll.pipelines.algorithms._validation import check_choice, check_positive, check_same_shape
from roll.runtime.errors import ConfigError

__all__ = [
    "FULL_KL",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "full_kl",
    "kl_penalty",
    "make_kl_controller",
]

FULL_KL = "full"

# k3 is clamped to this range: one token with a huge log-ratio (e.g. a near-zero reference probability)
# would otherwise dominate the whole batch's KL term and its gradient.
K3_CLAMP = 10.0
# Clamping the log-ratio before exp() keeps exp finite in float32 (no inf, no NaN gradients). The bound changes
# no value: |d| >= 20 already gives k3 > K3_CLAMP on both sides, so the output clamp wins either way.
_K3_LOG_RATIO_BOUND = 20.0


def _k1(diff: torch.Tensor) -> torch.Tensor:
    return diff


def _abs(diff: torch.Tensor) -> torch.Tensor:
    return diff.abs()


def _k2(diff: torch.Tensor) -> torch.Tensor:
    return 0.5 * diff.square()


def _k3(diff: torch.Tensor) -> torch.Tensor:
    neg = (-diff).clamp(-_K3_LOG_RATIO_BOUND, _K3_LOG_RATIO_BOUND)  # ref - logp
    return (torch.exp(neg) - neg - 1.0).clamp(-K3_CLAMP, K3_CLAMP)


KL_ESTIMATORS = {
    "k1": _k1,
    "kl": _k1,
    "abs": _abs,
    "k2": _k2,
    "mse": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}
"""Estimator name (including aliases) -> function of ``log_probs - ref_log_probs``."""


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference.

    Args:
        log_probs: (batch, response_len) policy log-probs of the sampled tokens.
        ref_log_probs: same shape, reference-model log-probs of the same tokens (treated as constants by the
            caller's choice: this function does not detach either input).
        kind: ``"k1"``/``"kl"``, ``"abs"``, ``"k2"``/``"mse"`` or ``"k3"``/``"low_var_kl"`` (see the module
            docstring). ``k3`` is clamped to ``[-10, 10]`` for stability; values below the clamp are exact.

    Returns:
        (batch, response_len) per-token estimate. Padding is not masked here; the caller applies its mask.
    """
    if kind == FULL_KL:
        raise ConfigError(
            "kl penalty 'full' is the exact KL over the whole vocabulary: it needs both models' distributions per "
            "token (full_kl), not the sampled tokens' log-probs"
        )
    check_choice("kind", kind, KL_ESTIMATORS)
    check_same_shape("log_probs", log_probs, ref_log_probs=ref_log_probs)
    return KL_ESTIMATORS[kind](log_probs - ref_log_probs)


def full_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact per-position ``KL(p || q) = sum_v exp(log p) * (log p - log q)`` over the last (vocabulary) dimension.

    Args:
        log_probs: (..., vocab) log-softmax of the policy (differentiable).
        ref_log_probs: same shape, the reference's log-softmax (the caller detaches it if it is a constant).

    Returns:
        (...) float32, >= 0 up to rounding. ROLL computes ``F.kl_div(ref, logp, log_target=True).sum(-1)``, the same
        sum, but on per-token log-probs, which sums a sequence instead of a vocabulary (see docs/roll-compat.md).
    """
    check_same_shape("log_probs", log_probs, ref_log_probs=ref_log_probs)
    if log_probs.dim() < 2:
        raise ConfigError(f"full_kl needs (..., vocab) distributions, got shape {tuple(log_probs.shape)}")
    log_p, log_q = log_probs.float(), ref_log_probs.float()
    return (log_p.exp() * (log_p - log_q)).sum(-1)


class FixedKLController:
    """A KL coefficient that never changes; ``update`` is a no-op kept for interface parity."""

    def __init__(self, kl_coef: float) -> None:
        self.value = check_positive("kl_coef", kl_coef, allow_zero=True)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Do nothing: the coefficient is fixed."""

    def state_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state(state, "fixed")
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards ``target_kl`` (Ziegler et al., 2019).

    Each update: ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``value *= 1 + error * n_steps / horizon``, so the coefficient grows when the policy drifts too far from the
    reference and shrinks when it stays close.
    """

    ERROR_CLIP = 0.2

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        self.value = check_positive("init_kl_coef", init_kl_coef, allow_zero=True)
        self.target_kl = check_positive("target_kl", target_kl)
        self.horizon = check_positive("horizon", horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt the coefficient after ``n_steps`` samples (or steps) with mean KL ``current_kl``."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -self.ERROR_CLIP), self.ERROR_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"type": "adaptive", "value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient. ``target_kl`` and ``horizon`` keep the values this object was built with,
        so a resumed run may change them in its config while continuing from the saved coefficient."""
        _check_state(state, "adaptive")
        self.value = float(state["value"])


def _check_state(state: dict[str, Any], kind: str) -> None:
    if not isinstance(state, dict) or "value" not in state:
        raise ConfigError(f"KL controller state={state!r} is not valid; expected a dict with a 'value' key")
    if state.get("type", kind) != kind:
        raise ConfigError(
            f"KL controller state has type={state['type']!r} but this controller is {kind!r}; "
            f"resume with the same kl_ctrl_type"
        )
    if not math.isfinite(float(state["value"])):
        raise ConfigError(f"KL controller state value={state['value']!r} is not a finite number")


def make_kl_controller(
    kl_ctrl_type: str,
    init_kl_coef: float,
    target_kl: float | None = None,
    horizon: float | None = None,
) -> FixedKLController | AdaptiveKLController:
    """Build the KL controller named by ``kl_ctrl_type`` (``"fixed"`` or ``"adaptive"``).

    ``target_kl`` and ``horizon`` are required for ``"adaptive"`` and ignored for ``"fixed"``.
    """
    check_choice("kl_ctrl_type", kl_ctrl_type, ("fixed", "adaptive"))
    if kl_ctrl_type == "fixed":
        return FixedKLController(init_kl_coef)
    for name, value in (("target_kl", target_kl), ("horizon", horizon)):
        if value is None:
            raise ConfigError(f"{name}=None is not valid for kl_ctrl_type='adaptive'; set {name} to a number > 0")
    return AdaptiveKLController(init_kl_coef, target_kl, horizon)  # type: ignore[arg-type]
