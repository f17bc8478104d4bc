"""ROLL's pg_variants (vanilla, tis, topr, cispo, kimi15) against a scalar reference written from the formulas:
the aggregated loss and its gradient w.r.t. the log-probs, on fixed tensors, to 1e-6."""

from __future__ import annotations

import math

import pytest
import torch

from roll.pipelines.algorithms.pg_variants import PGVariantParams, pg_variant_loss, score_split_loss
from roll.runtime import ConfigError

LOGP = [[-0.5, -1.2, -0.3, -2.0], [-0.9, -0.1, -1.5, -0.7], [-0.2, -0.4, -3.0, -1.1]]
OLD = [[-0.7, -0.4, -0.35, -1.0], [-0.9, -0.6, -1.2, -0.7], [-0.25, -0.45, -2.0, -1.3]]
ADV = [[1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, -0.5, -0.5], [0.3, -0.8, 2.0, 0.0]]
MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
SCORES = [1.0, 0.0, -1.0]


def _clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def _reference_token(variant: str, lp: float, old: float, a: float, score: float, p: PGVariantParams):
    """(loss, d loss / d lp) of one token, by hand; ratios under stop-gradient are constants."""
    r = math.exp(lp - old)
    if variant == "vanilla":
        return -a * lp, -a
    if variant == "tis":
        w = _clip(r, p.tis_lower_bound, p.tis_upper_bound)
        return -w * a * lp, -w * a
    if variant == "topr":
        if score > 0:
            return -p.topr_positive_weight * a * lp, -p.topr_positive_weight * a
        w = p.topr_negative_weight * _clip(r, 0.0, 1.0)
        return -w * a * lp, -w * a
    if variant == "cispo":
        low, high = 1 - p.cispo_epsilon_low, 1 + p.cispo_epsilon_high
        if p.cispo_unified_mask and ((a > 0 and r > high) or (a < 0 and r < low)):
            return 0.0, 0.0
        w = _clip(r, low, high)
        return -w * a * lp, -w * a
    if variant == "kimi15":
        return -a * lp + p.kimi15_tau / 2 * (lp - old) ** 2, -a + p.kimi15_tau * (lp - old)
    raise ValueError(variant)


def _reference(variant: str, mode: str, p: PGVariantParams) -> tuple[float, list[list[float]]]:
    rows = len(LOGP)
    token_count = sum(sum(m) for m in MASK)
    total, grads = 0.0, [[0.0] * len(LOGP[0]) for _ in range(rows)]
    for i in range(rows):
        count = sum(MASK[i])
        for t in range(len(LOGP[i])):
            if not MASK[i][t]:
                continue
            loss, grad = _reference_token(variant, LOGP[i][t], OLD[i][t], ADV[i][t], SCORES[i], p)
            scale = 1 / token_count if mode == "token-mean" else 1 / (count * rows)
            total += loss * scale
            grads[i][t] = grad * scale
    return total, grads


PARAMS = [
    PGVariantParams(),
    PGVariantParams(
        tis_lower_bound=0.5,
        tis_upper_bound=1.5,
        topr_positive_weight=0.7,
        topr_negative_weight=1.3,
        cispo_epsilon_low=0.2,
        cispo_epsilon_high=0.3,
        cispo_unified_mask=True,
        kimi15_tau=0.5,
    ),
]


@pytest.mark.parametrize("variant", ["vanilla", "tis", "topr", "cispo", "kimi15"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("params", PARAMS, ids=["roll-defaults", "custom"])
def test_variant_matches_the_reference(variant: str, mode: str, params: PGVariantParams) -> None:
    log_probs = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, metrics = pg_variant_loss(
        variant,
        log_probs,
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK),
        scores=torch.tensor(SCORES, dtype=torch.float64),
        params=params,
        loss_agg_mode=mode,
    )
    loss.backward()
    expected, expected_grad = _reference(variant, mode, params)
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert torch.allclose(log_probs.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-6)
    assert "ppo_kl" in metrics and math.isfinite(metrics["ratio_mean"])


def test_padding_garbage_does_not_leak() -> None:
    logp = torch.tensor(LOGP, dtype=torch.float64)
    logp[2, 3] = -math.inf  # a padded position
    loss, _ = pg_variant_loss(
        "tis", logp, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), loss_agg_mode="token-mean"
    )
    assert float(loss) == pytest.approx(_reference("tis", "token-mean", PGVariantParams())[0], abs=1e-6)


def test_is_weights_multiply_the_token_loss() -> None:
    weights = torch.full((3, 4), 0.5, dtype=torch.float64)
    args = (torch.tensor(LOGP, dtype=torch.float64), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK))
    plain, _ = pg_variant_loss("vanilla", *args)
    halved, _ = pg_variant_loss("vanilla", *args, is_weights=weights)
    assert float(halved) == pytest.approx(0.5 * float(plain), abs=1e-9)


def test_errors_name_the_problem() -> None:
    args = (torch.tensor(LOGP), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK))
    with pytest.raises(ConfigError, match="scores"):
        pg_variant_loss("topr", *args)
    with pytest.raises(ConfigError, match="pg_variant"):
        pg_variant_loss("reinforce", *args)
    with pytest.raises(ConfigError, match="tis_lower_bound"):
        PGVariantParams(tis_lower_bound=2.0, tis_upper_bound=1.0)


def _score_split_reference(mode: str, pos_coef: float, neg_coef: float) -> tuple[float, list[list[float]]]:
    """ROLL <= 0.1's postive_loss_coef / use_topr_neg_loss_coef terms by hand: each term sums its own samples'
    tokens, normalized like the policy loss (all valid tokens, or each sequence's own token count / all rows)."""
    rows = len(LOGP)
    token_count = sum(sum(m) for m in MASK)
    total, grads = 0.0, [[0.0] * len(LOGP[0]) for _ in range(rows)]
    for i in range(rows):
        positive = SCORES[i] > 0
        coef = pos_coef if positive else neg_coef
        for t in range(len(LOGP[i])):
            if not MASK[i][t]:
                continue
            w = 1.0 if positive else _clip(math.exp(LOGP[i][t] - OLD[i][t]), 0.0, 1.0)
            scale = coef / token_count if mode == "token-mean" else coef / (sum(MASK[i]) * rows)
            total += -w * ADV[i][t] * LOGP[i][t] * scale
            grads[i][t] = -w * ADV[i][t] * scale
    return total, grads


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize(("pos_coef", "neg_coef"), [(0.0, 0.7), (0.4, 0.0), (0.4, 0.7)])
def test_score_split_terms_match_the_reference(mode: str, pos_coef: float, neg_coef: float) -> None:
    log_probs = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(MASK)
    loss, metrics = score_split_loss(
        log_probs,
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        mask,
        torch.tensor(SCORES, dtype=torch.float64),
        positive_coef=pos_coef,
        negative_coef=neg_coef,
        loss_agg_mode=mode,
        num_tokens=int(mask.sum()),
        num_seqs=len(LOGP),
    )
    loss.backward()
    expected, expected_grad = _score_split_reference(mode, pos_coef, neg_coef)
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert torch.allclose(log_probs.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-6)
    assert ("positive_loss" in metrics) == (pos_coef > 0) and ("topr_neg_loss" in metrics) == (neg_coef > 0)


def test_clipped_is_variants_share_one_formula() -> None:
    """tis, cispo and topr's negative samples are the same clipped-IS REINFORCE with different bounds."""
    args = (torch.tensor(LOGP, dtype=torch.float64), torch.tensor(OLD), torch.tensor(ADV), torch.tensor([[1] * 4] * 3))
    tis, _ = pg_variant_loss("tis", *args, params=PGVariantParams(tis_lower_bound=0.9, tis_upper_bound=1.1))
    cispo, _ = pg_variant_loss("cispo", *args)  # default epsilons 0.1: the same [0.9, 1.1]
    assert float(tis) == pytest.approx(float(cispo), abs=1e-12)
    negatives = torch.tensor([-1.0, -1.0, -1.0])
    topr, _ = pg_variant_loss("topr", *args, scores=negatives)
    tis01, _ = pg_variant_loss("tis", *args)  # default [0, 1]
    assert float(topr) == pytest.approx(float(tis01), abs=1e-12)
