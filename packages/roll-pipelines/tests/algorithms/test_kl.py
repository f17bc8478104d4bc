"""KL estimators and KL-coefficient controllers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
    make_kl_controller,
)
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}


def _ref_kl(logp: float, ref: float, kind: str) -> float:
    d = logp - ref
    if kind in ("k1", "kl"):
        return d
    if kind == "abs":
        return abs(d)
    if kind in ("k2", "mse"):
        return 0.5 * d * d
    k3 = math.exp(ref - logp) - (ref - logp) - 1.0
    return min(max(k3, -10.0), 10.0)


@pytest.mark.parametrize("kind", sorted(KL_ESTIMATORS))
def test_kl_penalty_matches_reference(kind: str, log_probs_pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    logp, ref = log_probs_pair
    expected = torch.tensor(
        [[_ref_kl(logp[i, j].item(), ref[i, j].item(), kind) for j in range(5)] for i in range(6)], dtype=torch.float64
    )
    assert_close(kl_penalty(logp, ref, kind), expected, **TOL)


def test_hand_computed_values() -> None:
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    # d = log 2; k3 = exp(-d) + d - 1 = 0.5 + log 2 - 1.
    assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[math.log(2)]], dtype=torch.float64))
    assert_close(kl_penalty(ref, logp, "abs"), torch.tensor([[math.log(2)]], dtype=torch.float64))
    assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[0.5 * math.log(2) ** 2]], dtype=torch.float64))
    assert_close(kl_penalty(logp, ref, "k3"), torch.tensor([[math.log(2) - 0.5]], dtype=torch.float64))


@pytest.mark.parametrize(("alias", "canonical"), [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_aliases(alias: str, canonical: str, log_probs_pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    logp, ref = log_probs_pair
    assert_close(kl_penalty(logp, ref, alias), kl_penalty(logp, ref, canonical), atol=0.0, rtol=0.0)


def test_k3_is_clamped_and_has_finite_gradients() -> None:
    # ref - logp = 200 would overflow exp() in float32; -50 gives k3 = 49 before the clamp.
    logp = torch.tensor([[-200.0, 0.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -50.0, -1.5]])
    k3 = kl_penalty(logp, ref, "k3")
    assert_close(k3[0, :2], torch.tensor([10.0, 10.0]))
    assert_close(k3[0, 2], torch.tensor(math.exp(-0.5) + 0.5 - 1.0))
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] == 0.0  # clamped tokens carry no gradient
    assert (k3 >= 0).all()


def test_unknown_kind_lists_choices() -> None:
    with pytest.raises(ConfigError, match=r"kind='k4'.*'abs'.*'k1'.*'k3'.*'low_var_kl'"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")


def test_shape_mismatch_is_named() -> None:
    with pytest.raises(ConfigError, match=r"ref_log_probs has shape \(1, 3\)"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3), "k1")


def test_fixed_controller() -> None:
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=100.0, n_steps=1000)
    assert ctrl.value == 0.05
    other = FixedKLController(0.0)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_matches_hand_computation() -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    # kl 9 -> error 9/6 - 1 = 0.5, clipped to 0.2: 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512
    ctrl.update(9.0, 256)
    assert ctrl.value == pytest.approx(0.100512, abs=1e-12)
    # kl 3 -> error -0.5, clipped to -0.2: 0.100512 * (1 - 0.2 * 512 / 10000) = 0.100512 * 0.98976
    ctrl.update(3.0, 512)
    assert ctrl.value == pytest.approx(0.09948275712, abs=1e-12)
    # kl 6.6 -> error 0.1 (inside the clip): * (1 + 0.1 * 100 / 10000) = * 1.001
    ctrl.update(6.6, 100)
    assert ctrl.value == pytest.approx(0.09958223987712, abs=1e-12)
    # kl exactly on target: no change
    ctrl.update(6.0, 5000)
    assert ctrl.value == pytest.approx(0.09958223987712, abs=1e-12)


def test_adaptive_state_dict_round_trip_resumes_identically() -> None:
    ctrl = AdaptiveKLController(0.2, target_kl=1.0, horizon=500)
    for kl in (2.0, 0.5, 1.1):
        ctrl.update(kl, 64)
    resumed = AdaptiveKLController(0.2, target_kl=1.0, horizon=500)
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == ctrl.value
    for kl in (3.0, 0.9):
        ctrl.update(kl, 32)
        resumed.update(kl, 32)
    assert resumed.value == ctrl.value
    with pytest.raises(ConfigError, match="kl_ctrl_type"):
        FixedKLController(0.1).load_state_dict(ctrl.state_dict())


def test_make_kl_controller() -> None:
    assert isinstance(make_kl_controller("fixed", 0.1), FixedKLController)
    adaptive = make_kl_controller("adaptive", 0.1, target_kl=6.0, horizon=10000)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target_kl, adaptive.horizon) == (0.1, 6.0, 10000.0)
    with pytest.raises(ConfigError, match=r"kl_ctrl_type='pid'.*\['adaptive', 'fixed'\]"):
        make_kl_controller("pid", 0.1)
    with pytest.raises(ConfigError, match="horizon=None"):
        make_kl_controller("adaptive", 0.1, target_kl=6.0)
    with pytest.raises(ConfigError, match="target_kl=0"):
        make_kl_controller("adaptive", 0.1, target_kl=0, horizon=10)
    with pytest.raises(ConfigError, match="kl_coef=-1"):
        FixedKLController(-1)


# --- kl penalty 'full': the exact KL over the vocabulary ------------------------------------------------------
FULL_P = [[[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]], [[0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]
FULL_Q = [[[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]], [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]]


def test_full_kl_is_the_exact_vocabulary_sum() -> None:
    from roll.pipelines.algorithms import full_kl

    log_p, log_q = torch.tensor(FULL_P, dtype=torch.float64).log(), torch.tensor(FULL_Q, dtype=torch.float64).log()
    got = full_kl(log_p, log_q)
    expected = [
        [sum(p * math.log(p / q) for p, q in zip(ps, qs)) for ps, qs in zip(pr, qr)] for pr, qr in zip(FULL_P, FULL_Q)
    ]
    assert got.shape == (2, 2)
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert float(got[0, 1]) == pytest.approx(0.0, abs=1e-7)  # identical distributions
    # What ROLL's compute_approx_kl('full') computes when given whole distributions (its intent) is the same sum.
    roll = torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(got.double(), roll, atol=1e-6)


def test_full_kl_needs_distributions() -> None:
    from roll.pipelines.algorithms import full_kl

    with pytest.raises(ConfigError, match="whole vocabulary"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")
    with pytest.raises(ConfigError, match="vocab"):
        full_kl(torch.zeros(3), torch.zeros(3))
