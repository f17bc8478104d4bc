"""Distillation maths against independent references: hand-computed values and a plain-Python (math module)
re-derivation of every objective, including top-k truncation, temperature, ``-inf`` entries and masking."""

from __future__ import annotations

import math

import pytest
import torch

from roll.pipelines.algorithms import (
    KD_OBJECTIVES,
    gather_student_logits,
    kd_divergence,
    kd_loss,
    opd_advantages,
    teacher_topk,
)
from roll.runtime.errors import ConfigError

TOL = 1e-6


def _softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    exps = [math.exp(x - top) for x in xs]
    return [e / sum(exps) for e in exps]


def _kl(a: list[float], b: list[float]) -> float:
    return sum(x * (math.log(x) - math.log(y)) for x, y in zip(a, b) if x > 0)


def _reference(objective: str, teacher: list[float], student: list[float], k: int, t_kd: float, t_teacher: float,
               lam: float = 0.1, alpha: float = 0.5) -> float:  # fmt: skip
    """One token, from first principles: the teacher at t_kd * t_teacher and the student at t_kd (as ROLL), the
    teacher's top-k ids, both renormalised over them, then the divergence."""
    scaled_t = [x / (t_kd * t_teacher) for x in teacher]
    ids = sorted(range(len(teacher)), key=lambda i: -scaled_t[i])[: k or len(teacher)]
    p = _softmax([scaled_t[i] for i in ids])
    q = _softmax([student[i] / t_kd for i in ids])
    if objective == "forward_kl":
        return _kl(p, q)
    if objective == "reverse_kl":
        return _kl(q, p)
    if objective == "skewed_forward_kl":
        return _kl(p, [lam * a + (1 - lam) * b for a, b in zip(p, q)])
    if objective == "skewed_reverse_kl":
        return _kl(q, [(1 - lam) * a + lam * b for a, b in zip(p, q)])
    if objective == "js_divergence":
        m = [(a + b) / 2 for a, b in zip(p, q)]
        return (_kl(p, m) + _kl(q, m)) / 2
    # adaptive_kl: ids by ascending teacher prob; tail = cumulative prob <= alpha
    order = sorted(range(len(p)), key=lambda i: p[i])
    cum, head, tail = 0.0, 0.0, 0.0
    for i in order:
        cum += p[i]
        if cum <= alpha:
            tail += abs(p[i] - q[i])
        else:
            head += abs(p[i] - q[i])
    return (head * _kl(p, q) + tail * _kl(q, p)) / (head + tail)


def _divergence(objective, teacher_logits, student_logits, k, t_kd=1.0, t_teacher=1.0, **kw):
    top = teacher_topk(torch.tensor(teacher_logits, dtype=torch.float64), k, t_kd * t_teacher)
    student = gather_student_logits(torch.tensor(student_logits, dtype=torch.float64), top.indices)
    return kd_divergence(student, top.log_probs, objective, temperature=t_kd, **kw)


def test_forward_kl_by_hand_with_top2_renormalisation():
    # Teacher logits [2, 1, 0, -1]: top-2 ids {0, 1}, p = softmax([2, 1]) = [e/(e+1), 1/(e+1)].
    # Student logits at ids {0, 1}: [0, 0] -> q = [1/2, 1/2]. KL(p||q) = sum p log(2p).
    e = math.e
    p = [e / (e + 1), 1 / (e + 1)]
    expected = sum(x * math.log(2 * x) for x in p)  # 0.7311 ln 1.4621 + 0.2689 ln 0.5379 = 0.1109441
    got = _divergence("forward_kl", [2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 5.0, 5.0], k=2)
    assert abs(float(got) - expected) < TOL
    assert abs(expected - 0.1109441) < 1e-6  # the hand value, so the reference itself is pinned


def test_reverse_kl_by_hand():
    # Same tokens: KL(q||p) = sum 0.5 log(0.5 / p).
    e = math.e
    expected = 0.5 * math.log(0.5 * (e + 1) / e) + 0.5 * math.log(0.5 * (e + 1))
    got = _divergence("reverse_kl", [2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 5.0, 5.0], k=2)
    assert abs(float(got) - expected) < TOL


def test_identical_distributions_give_zero_for_every_objective():
    logits = [1.5, -0.3, 0.2, 2.0, -1.0]
    for objective in KD_OBJECTIVES:
        assert abs(float(_divergence(objective, logits, logits, k=3))) < TOL, objective


@pytest.mark.parametrize("objective", KD_OBJECTIVES)
@pytest.mark.parametrize(("k", "t_kd", "t_teacher"), [(0, 1.0, 1.0), (3, 1.0, 1.0), (2, 2.0, 1.0), (4, 0.7, 1.5)])
def test_every_objective_matches_a_plain_python_reference(objective, k, t_kd, t_teacher):
    gen = torch.Generator().manual_seed(KD_OBJECTIVES.index(objective) * 10 + k)
    for _ in range(5):
        teacher = (torch.randn(6, generator=gen, dtype=torch.float64) * 2).tolist()
        student = (torch.randn(6, generator=gen, dtype=torch.float64) * 2).tolist()
        kw = {"skew_lambda": 0.3, "adaptive_alpha": 0.4}
        got = float(_divergence(objective, teacher, student, k, t_kd, t_teacher, **kw))
        want = _reference(objective, teacher, student, k, t_kd, t_teacher, lam=0.3, alpha=0.4)
        assert abs(got - want) < TOL, (objective, got, want)


def test_topk_truncates_and_renormalises_the_teacher():
    top = teacher_topk(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), k=2)
    assert top.indices.tolist() == [[1, 3]]
    assert torch.allclose(top.log_probs.exp().sum(-1), torch.ones(1))
    assert torch.allclose(top.log_probs, torch.log_softmax(torch.tensor([[3.0, 2.0]]), -1))
    full = teacher_topk(torch.tensor([[0.0, 3.0]]), k=0)
    assert full.indices is None and torch.allclose(full.log_probs.exp().sum(-1), torch.ones(1))


def test_teacher_temperature_scales_before_the_topk_softmax():
    top = teacher_topk(torch.tensor([2.0, 0.0, -5.0]), k=2, temperature=2.0)
    assert torch.allclose(top.log_probs, torch.log_softmax(torch.tensor([1.0, 0.0]), -1))


def test_infinite_teacher_entries_contribute_nothing_and_gradients_stay_finite():
    # A masked vocabulary slot (-inf) inside the top-k: the divergence equals that over the finite ids only.
    teacher = torch.tensor([[1.0, 0.5, float("-inf")]])
    student = torch.tensor([[0.2, -0.1, 0.3]], requires_grad=True)
    top = teacher_topk(teacher, k=3)
    for objective in KD_OBJECTIVES:
        got = kd_divergence(gather_student_logits(student, top.indices), top.log_probs, objective)
        got.sum().backward()
        assert torch.isfinite(got).all() and torch.isfinite(student.grad).all(), objective
        student.grad = None
    fkl = kd_divergence(gather_student_logits(student.detach(), top.indices), top.log_probs, "forward_kl")
    p = _softmax([1.0, 0.5])
    q = _softmax([0.2, -0.1, 0.3])  # the student is renormalised over all k ids, -inf teacher slot included
    expected = sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q[:2]))
    assert abs(fkl.item() - expected) < TOL


def test_kd_loss_masks_and_normalises_by_the_given_count():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    assert float(kd_loss(per_token, mask)) == pytest.approx((1 + 2 + 5) / 3)
    assert float(kd_loss(per_token, mask, num_tokens=8)) == pytest.approx(8 / 8)


def test_the_gradient_of_forward_kl_is_q_minus_p():
    # d/dz KL(p || softmax(z)) = softmax(z) - p (the classic KD gradient), on the teacher's top-k ids.
    teacher = torch.tensor([3.0, 1.0, 0.0, -2.0])
    top = teacher_topk(teacher, k=3)
    z = torch.tensor([0.1, 0.4, -0.3, 9.0], requires_grad=True)
    kd_divergence(gather_student_logits(z, top.indices), top.log_probs, "forward_kl").backward()
    q = torch.softmax(z.detach()[top.indices], -1)
    expected = torch.zeros(4)
    expected[top.indices] = q - top.log_probs.exp()
    assert torch.allclose(z.grad, expected, atol=TOL)


def test_opd_advantage_is_minus_coef_times_the_log_ratio():
    student = torch.tensor([[-1.0, -2.0, -0.5]])
    teacher = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1, 1, 0]])
    adv = opd_advantages(student, teacher, mask, coef=2.0)
    assert adv.tolist() == [[-1.0, 2.0, 0.0]]  # -2 * (0.5, -1.0), the masked token 0


def test_bad_arguments_name_the_setting():
    logits = torch.zeros(2, 4)
    with pytest.raises(ConfigError, match="kd_objective"):
        kd_divergence(logits, logits, "tv_distance")
    with pytest.raises(ConfigError, match="logits_topk"):
        teacher_topk(logits, k=8)
    with pytest.raises(ConfigError, match="skew_lambda"):
        kd_divergence(logits, logits, "skewed_forward_kl", skew_lambda=1.5)
