"""Loss aggregation, PPO/GSPO policy loss, value loss, KL/entropy terms and truncated IS weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms import (
    LOSS_AGG_MODES,
    aggregate_loss,
    entropy_loss,
    kl_loss,
    kl_penalty,
    policy_loss,
    truncated_importance_weights,
    value_loss,
)
from roll.runtime.errors import ConfigError

TOL = {"atol": 1e-6, "rtol": 1e-6}
F64 = torch.float64


def _cols(mask: torch.Tensor, i: int) -> list[int]:
    return [j for j in range(mask.shape[1]) if mask[i, j]]


def _ref_aggregate(loss_mat, mask, mode, num_tokens=None, num_seqs=None, norm_length=None) -> float:
    rows = [[loss_mat[i, j].item() for j in _cols(mask, i)] for i in range(loss_mat.shape[0])]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / (num_tokens or sum(len(r) for r in rows))
    if mode == "seq-mean-token-sum":
        per_seq = [sum(r) for r in rows]
    elif mode == "seq-mean-token-mean":
        per_seq = [sum(r) / len(r) if r else 0.0 for r in rows]
    else:
        per_seq = [sum(r) / (norm_length or loss_mat.shape[1]) for r in rows]
    return sum(per_seq) / (num_seqs or len(rows))


def _scalar(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ---- aggregate_loss ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_matches_reference(mode: str, token_rewards, mask) -> None:
    mask = mask.clone()
    mask[2] = False  # a sequence with no valid token contributes 0
    assert_close(aggregate_loss(token_rewards, mask, mode), _scalar(_ref_aggregate(token_rewards, mask, mode)), **TOL)
    kwargs = {"num_tokens": 40, "num_seqs": 9, "norm_length": 7}
    assert_close(
        aggregate_loss(token_rewards, mask.float(), mode, **kwargs),
        _scalar(_ref_aggregate(token_rewards, mask, mode, **kwargs)),
        **TOL,
    )


def test_aggregate_hand_values() -> None:
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate_loss(loss_mat, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 / 3 + 4 / 3) / 2)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_add_up_with_global_counts(mode: str, mask) -> None:
    loss_mat = torch.randn(6, 5, dtype=F64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    whole = aggregate_loss(loss_mat, mask, mode)
    counts = {"num_tokens": int(mask.sum()), "num_seqs": 6}
    parts = [aggregate_loss(loss_mat[rows], mask[rows], mode, **counts) for rows in (slice(0, 2), slice(2, 6))]
    assert_close(parts[0] + parts[1], whole, **TOL)
    (grad_whole,) = torch.autograd.grad(whole, loss_mat)
    (grad_parts,) = torch.autograd.grad(parts[0] + parts[1], loss_mat)
    assert_close(grad_parts, grad_whole, **TOL)


def test_aggregate_errors(token_rewards, mask) -> None:
    with pytest.raises(ConfigError, match=r"mode='sum'.*'seq-mean-token-mean'.*'token-mean'"):
        aggregate_loss(token_rewards, mask, "sum")
    with pytest.raises(ConfigError, match=r"loss_mat has shape \(6, 5\); expected \(6, 4\) \(the shape of mask\)"):
        aggregate_loss(token_rewards, mask[:, :4], "token-mean")
    with pytest.raises(ConfigError, match="num_tokens=0"):
        aggregate_loss(token_rewards, mask, "token-mean", num_tokens=0)


# ---- policy_loss ------------------------------------------------------------------------------------------------


def _ref_policy(new, old, adv, mask, clip_low, clip_high, dual_clip, sequence):
    """Per-token PPO loss and clip flags by plain loops; GSPO uses s_i for every token of row i."""
    loss_mat = torch.zeros(new.shape, dtype=F64)
    clipped, lower, ratios = [], [], []
    for i in range(new.shape[0]):
        cols = _cols(mask, i)
        s_i = math.exp(sum(new[i, j].item() - old[i, j].item() for j in cols) / max(len(cols), 1))
        for j in cols:
            r = s_i if sequence else math.exp(new[i, j].item() - old[i, j].item())
            a = adv[i, j].item()
            unclipped, clipped_term = -a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high)
            value = max(unclipped, clipped_term)
            clipped.append(clipped_term > unclipped)
            is_lower = dual_clip is not None and a < 0 and value > -a * dual_clip
            lower.append(is_lower)
            loss_mat[i, j] = -a * dual_clip if is_lower else value
            ratios.append(r)
    metrics = {
        "pg_clipfrac": sum(clipped) / len(clipped),
        "pg_clipfrac_lower": sum(lower) / len(lower),
        "ratio_mean": sum(ratios) / len(ratios),
        "ratio_max": max(ratios),
        "ratio_min": min(ratios),
    }
    return loss_mat, metrics


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize(
    ("clip_low", "clip_high", "dual_clip"), [(0.2, 0.2, None), (0.2, 0.3, None), (0.1, 0.3, 1.2), (3e-4, 4e-4, 3.0)]
)
def test_policy_loss_matches_reference(log_probs_pair, mask, ratio_level, clip_low, clip_high, dual_clip) -> None:
    new, old = log_probs_pair
    adv = torch.randn(6, 5, dtype=F64, generator=torch.Generator().manual_seed(11))
    sequence = ratio_level == "sequence"
    ref_mat, ref_metrics = _ref_policy(new, old, adv, mask, clip_low, clip_high, dual_clip, sequence)
    for mode in LOSS_AGG_MODES:
        loss, metrics = policy_loss(
            new, old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
            ratio_level=ratio_level, loss_agg_mode=mode,
        )  # fmt: skip
        assert_close(loss, _scalar(_ref_aggregate(ref_mat, mask, mode)), **TOL)
    for key, expected in ref_metrics.items():
        assert metrics[key] == pytest.approx(expected, abs=1e-6), key
    assert 0 < metrics["pg_clipfrac"] < 1
    assert (metrics["pg_clipfrac_lower"] > 0) == (dual_clip == 1.2)  # the fixture reaches the dual clip at 1.2
    ppo_kl = sum(old[i, j].item() - new[i, j].item() for i in range(6) for j in _cols(mask, i)) / int(mask.sum())
    assert metrics["ppo_kl"] == pytest.approx(ppo_kl, abs=1e-6)


def test_clip_higher_changes_which_tokens_get_gradient() -> None:
    # Positive advantages with ratios 1.1, 1.25, 1.35, and one negative advantage with ratio 0.75.
    old = torch.zeros(1, 4, dtype=F64)
    new = torch.log(torch.tensor([[1.1, 1.25, 1.35, 0.75]], dtype=F64)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 4, dtype=torch.bool)

    def grads(clip_high: float) -> torch.Tensor:
        loss, _ = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=clip_high)
        return torch.autograd.grad(loss, new)[0]

    # d/dlogp of -A * r / 4 tokens is -A * r / 4 when the ratio is inside the clip range, else 0.
    assert_close(grads(0.2), torch.tensor([[-1.1 / 4, 0.0, 0.0, 0.0]], dtype=F64), **TOL)
    assert_close(grads(0.28), torch.tensor([[-1.1 / 4, -1.25 / 4, 0.0, 0.0]], dtype=F64), **TOL)
    _, metrics = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)  # 1.35 above 1.28 and 0.75 below 0.8


def test_dual_clip_caps_negative_advantage_loss() -> None:
    old = torch.zeros(1, 3, dtype=F64)
    new = torch.tensor([[2.0, 0.5, 2.0]], dtype=F64, requires_grad=True)  # ratios e^2 ~ 7.39, e^0.5 ~ 1.65
    adv = torch.tensor([[-1.0, -2.0, 1.0]], dtype=F64)
    mask = torch.ones(1, 3)
    loss, metrics = policy_loss(new, old, adv, mask, dual_clip=3.0, loss_agg_mode="seq-mean-token-sum")
    # token 0: max(7.39, 1.2) capped at 3; token 1: max(2*1.65, 2*1.2) = 3.30 < 6 kept; token 2: -1.2 (clipped)
    expected = 3.0 + 2.0 * math.exp(0.5) - 1.2
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(loss, new)
    assert_close(grad, torch.tensor([[0.0, 2.0 * math.exp(0.5), 0.0]], dtype=F64), **TOL)
    plain, _ = policy_loss(new, old, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert plain.item() == pytest.approx(math.exp(2.0) + 2.0 * math.exp(0.5) - 1.2, abs=1e-9)


def test_gspo_ratio_value_and_per_token_gradient(log_probs_pair, mask) -> None:
    new, old = log_probs_pair
    new = new.clone().requires_grad_()
    adv = torch.tensor([1.5, -0.5, 2.0, -1.0, 0.25, 0.75], dtype=F64)[:, None].expand(6, 5)
    # A clip range wide enough to stay inactive, so the loss is -A * s_i on every token.
    loss, metrics = policy_loss(
        new, old, adv, mask, clip_low=1.0, clip_high=100.0, ratio_level="sequence", loss_agg_mode="seq-mean-token-mean"
    )
    lengths = mask.sum(dim=-1).double()
    seq_ratio = torch.exp(((new - old) * mask).sum(dim=-1) / lengths).detach()
    assert_close(loss, -(adv[:, 0] * seq_ratio).mean(), **TOL)
    assert metrics["ratio_max"] == pytest.approx(seq_ratio.max().item())
    (grad,) = torch.autograd.grad(loss, new)
    # Analytic: d loss / d logp_{i,t} = -A_i * s_i / |y_i| / batch on valid tokens.
    analytic = (-adv[:, 0] * seq_ratio / lengths / 6)[:, None] * mask
    assert_close(grad, analytic, **TOL)
    # ...which equals the gradient of the sequence-level GSPO objective -mean_i(A_i * exp(mean_t log-ratio)).
    gspo = -(adv[:, 0] * torch.exp(((new - old) * mask).sum(dim=-1) / lengths)).mean()
    assert_close(torch.autograd.grad(gspo, new)[0], analytic, **TOL)


def test_is_weights_multiply_and_stay_detached(log_probs_pair, mask) -> None:
    new, old = log_probs_pair
    adv = torch.ones(6, 5, dtype=F64)
    weights = torch.rand(6, 5, dtype=F64, generator=torch.Generator().manual_seed(5)).requires_grad_()
    ref_mat, _ = _ref_policy(new, old, adv, mask, 0.2, 0.2, None, sequence=False)
    new = new.clone().requires_grad_()
    loss, _ = policy_loss(new, old, adv, mask, is_weights=weights, loss_agg_mode="seq-mean-token-sum")
    assert_close(loss, _scalar(_ref_aggregate(ref_mat * weights.detach(), mask, "seq-mean-token-sum")), **TOL)
    loss.backward()
    assert weights.grad is None and new.grad is not None


def test_padding_garbage_gives_finite_loss_and_gradient(log_probs_pair, mask) -> None:
    new, old = log_probs_pair
    new = new.masked_fill(~mask, -math.inf).requires_grad_()
    old = old.masked_fill(~mask, math.nan)
    for level in ("token", "sequence"):
        loss, metrics = policy_loss(new, old, torch.ones(6, 5), mask, ratio_level=level, dual_clip=3.0)
        (grad,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert (grad[~mask] == 0).all()
        assert all(math.isfinite(v) for v in metrics.values())


def test_policy_loss_errors(log_probs_pair, mask) -> None:
    new, old = log_probs_pair
    adv = torch.ones(6, 5)
    with pytest.raises(ConfigError, match=r"dual_clip=1.0 is not valid; it must be > 1"):
        policy_loss(new, old, adv, mask, dual_clip=1.0)
    with pytest.raises(ConfigError, match=r"ratio_level='seq'.*\['sequence', 'token'\]"):
        policy_loss(new, old, adv, mask, ratio_level="seq")
    with pytest.raises(ConfigError, match=r"loss_agg_mode='mean'.*'seq-mean-token-sum-norm'"):
        policy_loss(new, old, adv, mask, loss_agg_mode="mean")
    with pytest.raises(ConfigError, match=r"advantages has shape \(6,\)"):
        policy_loss(new, old, torch.ones(6), mask)
    with pytest.raises(ConfigError, match=r"clip_low=1\.5"):
        policy_loss(new, old, adv, mask, clip_low=1.5)


# ---- value, KL and entropy losses -------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_reference(values, mask, clip) -> None:
    gen = torch.Generator().manual_seed(13)
    old = values + 0.3 * torch.randn(6, 5, dtype=F64, generator=gen)
    returns = values + torch.randn(6, 5, dtype=F64, generator=gen)
    ref_mat = torch.zeros(6, 5, dtype=F64)
    flags = []
    for i in range(6):
        for j in _cols(mask, i):
            v, o, r = values[i, j].item(), old[i, j].item(), returns[i, j].item()
            unclipped = (v - r) ** 2
            clipped = (min(max(v, o - clip), o + clip) - r) ** 2 if clip is not None else unclipped
            ref_mat[i, j] = 0.5 * max(unclipped, clipped)
            flags.append(clipped > unclipped)
    for mode in LOSS_AGG_MODES:
        loss, metrics = value_loss(values, old, returns, mask, clip=clip, loss_agg_mode=mode)
        assert_close(loss, _scalar(_ref_aggregate(ref_mat, mask, mode)), **TOL)
    assert metrics["vf_clipfrac"] == pytest.approx(sum(flags) / len(flags))
    if clip is not None:
        assert 0 < metrics["vf_clipfrac"] < 1  # the fixture exercises both branches


def test_kl_and_entropy_losses(log_probs_pair, mask) -> None:
    new, ref = log_probs_pair
    new = new.clone().requires_grad_()
    ref = ref.clone().requires_grad_()
    for kind in ("k1", "k2", "k3", "abs"):
        got = kl_loss(new, ref, mask, kind=kind, loss_agg_mode="seq-mean-token-mean")
        per_token = kl_penalty(new.detach(), ref.detach(), kind)
        assert_close(got, _scalar(_ref_aggregate(per_token, mask, "seq-mean-token-mean")), **TOL)
    got.backward()
    assert ref.grad is None and new.grad is not None
    entropy = new.detach().neg()
    assert_close(entropy_loss(entropy, mask), _scalar(_ref_aggregate(entropy, mask, "token-mean")), **TOL)


# ---- truncated importance sampling ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_truncated_importance_weights_match_reference(log_probs_pair, mask, level, mode) -> None:
    train, rollout = log_probs_pair
    cap = 1.3
    expected = torch.zeros(6, 5, dtype=F64)
    capped = []
    for i in range(6):
        cols = _cols(mask, i)
        seq_ratio = math.exp(sum(train[i, j].item() - rollout[i, j].item() for j in cols))
        for j in cols:
            ratio = seq_ratio if level == "sequence" else math.exp(train[i, j].item() - rollout[i, j].item())
            capped.append(ratio > cap)
            expected[i, j] = min(ratio, cap) if mode == "truncate" else float(ratio <= cap)
    weights, metrics = truncated_importance_weights(
        train.requires_grad_(), rollout, mask, cap=cap, level=level, mode=mode
    )
    assert not weights.requires_grad
    assert_close(weights, expected, **TOL)
    assert metrics["is_capped_frac"] == pytest.approx(sum(capped) / len(capped))
    assert 0 < metrics["is_capped_frac"] < 1
    assert metrics["is_weight_mean"] == pytest.approx(expected[mask].mean().item())


def test_sequence_importance_weights_do_not_overflow() -> None:
    train = torch.full((2, 50), 0.0)
    rollout = torch.full((2, 50), -30.0)  # sequence log-ratio 1500: exp would be inf in any dtype
    rollout[1] = 30.0
    weights, _ = truncated_importance_weights(train, rollout, torch.ones(2, 50), cap=2.0, level="sequence")
    assert_close(weights[0], torch.full((50,), 2.0))
    assert_close(weights[1], torch.zeros(50))
    with pytest.raises(ConfigError, match=r"level='seq'.*\['sequence', 'token'\]"):
        truncated_importance_weights(train, rollout, torch.ones(2, 50), cap=2.0, level="seq")
    with pytest.raises(ConfigError, match=r"mode='clip'.*\['mask', 'truncate'\]"):
        truncated_importance_weights(train, rollout, torch.ones(2, 50), cap=2.0, mode="clip")
