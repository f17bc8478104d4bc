"""DPO / IPO losses against the closed-form formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms import dpo_loss, sequence_log_probs
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}
F64 = torch.float64

PC = torch.tensor([-10.0, -4.0, -7.5, -3.0], dtype=F64)
PR = torch.tensor([-12.0, -3.5, -7.0, -9.0], dtype=F64)
RC = torch.tensor([-11.0, -4.5, -7.0, -3.2], dtype=F64)
RR = torch.tensor([-11.5, -3.0, -7.25, -8.0], dtype=F64)


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _ref(loss_type: str, beta: float, ls: float) -> list[float]:
    out = []
    for pc, pr, rc, rr in zip(PC.tolist(), PR.tolist(), RC.tolist(), RR.tolist()):
        logits = (pc - pr) - (rc - rr)
        if loss_type == "sigmoid":
            out.append(-(1 - ls) * _log_sigmoid(beta * logits) - ls * _log_sigmoid(-beta * logits))
        else:
            out.append((logits - 1 / (2 * beta)) ** 2)
    return out


@pytest.mark.parametrize(("loss_type", "beta", "ls"), [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("ipo", 0.1, 0.0)])
def test_dpo_matches_reference(loss_type: str, beta: float, ls: float) -> None:
    losses, chosen, rejected = dpo_loss(PC, PR, RC, RR, beta=beta, label_smoothing=ls, loss_type=loss_type)
    assert_close(losses, torch.tensor(_ref(loss_type, beta, ls), dtype=F64), **TOL)
    assert_close(chosen, beta * (PC - RC), **TOL)
    assert_close(rejected, beta * (PR - RR), **TOL)


def test_dpo_hand_value_and_gradient() -> None:
    # logits = (-1 - -3) - (-2 - -2) = 2, beta = 0.5: loss = -log sigmoid(1) = log(1 + e^-1).
    pc = torch.tensor([-1.0], dtype=F64, requires_grad=True)
    pr = torch.tensor([-3.0], dtype=F64, requires_grad=True)
    ref = torch.tensor([-2.0], dtype=F64, requires_grad=True)
    losses, chosen, _ = dpo_loss(pc, pr, ref, ref, beta=0.5)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-12)
    losses.sum().backward()
    # d/dpc of -log sigmoid(beta * logits) = -beta * sigmoid(-beta * logits)
    assert pc.grad.item() == pytest.approx(-0.5 / (1 + math.e), abs=1e-12)
    assert pr.grad.item() == pytest.approx(0.5 / (1 + math.e), abs=1e-12)
    assert ref.grad is None and not chosen.requires_grad


def test_sequence_log_probs() -> None:
    token_logps = torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -math.inf, -math.inf]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert_close(sequence_log_probs(token_logps, mask), torch.tensor([-1.5, -0.25], dtype=F64))


def test_dpo_errors() -> None:
    with pytest.raises(ConfigError, match=r"loss_type='hinge'.*\['ipo', 'sigmoid'\]"):
        dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="hinge")
    with pytest.raises(ConfigError, match="beta=0"):
        dpo_loss(PC, PR, RC, RR, beta=0)
    with pytest.raises(ConfigError, match=r"label_smoothing=0\.6"):
        dpo_loss(PC, PR, RC, RR, beta=0.1, label_smoothing=0.6)
    with pytest.raises(ConfigError, match="only used by loss_type='sigmoid'"):
        dpo_loss(PC, PR, RC, RR, beta=0.1, label_smoothing=0.1, loss_type="ipo")
    with pytest.raises(ConfigError, match=r"ref_rejected_logps has shape \(3,\)"):
        dpo_loss(PC, PR, RC, RR[:3], beta=0.1)
