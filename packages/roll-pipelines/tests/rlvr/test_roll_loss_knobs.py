"""ROLL's loss and advantage knobs reach the loss / the training targets from config keys (ROLL's flat names),
checked against plain-Python references: rl_loss_coef and the score-split TOPR terms, train_infer_correction
filters, per-domain statistics, and reward_clip's order."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from roll.pipelines.algorithms import kl_penalty
from roll.pipelines.compat import translate
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.workers import actor_loss
from roll.protocol import DataProto
from roll.strategies import LossScale

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}


def make_config(**overrides) -> RLVRConfig:
    data = {
        "pipeline_cls": "rlvr",
        "actor_train": {**ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
        "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
        "rewards": {"math": {"reward_type": "math"}, "code": {"reward_type": "code"}},
        "response_length": 4,
        **overrides,
    }
    return RLVRConfig.model_validate(data)


MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]


def scored_batch(scores: list[float], tags: list[str] | None = None) -> DataProto:
    torch.manual_seed(0)
    return DataProto.from_dict(
        {
            "response_mask": torch.tensor(MASK),
            "scores": torch.tensor(scores),
            "group_index": torch.tensor([0, 0, 1, 1]),
            "old_log_probs": torch.randn(4, 4) * 0.3 - 1.0,
            "ref_log_probs": torch.randn(4, 4) * 0.3 - 1.0,
            "rollout_log_probs": torch.randn(4, 4) * 0.3 - 1.0,
        },
        {"finish_reason": ["stop"] * 4, "tag": np.array(tags or ["math"] * 4, dtype=object)},
    )


# --- rl_loss_coef, postive_loss_coef, use_topr_neg_loss_coef ----------------------------------------------------
@pytest.mark.parametrize(("rl", "pos", "neg"), [(1.0, 0.0, 0.0), (0.5, 0.25, 0.75), (0.0, 0.0, 0.6)])
def test_rl_loss_coef_and_score_split_terms_reach_the_actor_loss(rl: float, pos: float, neg: float) -> None:
    config = make_config(
        pg_variant="vanilla",
        rl_loss_coef=rl,
        postive_loss_coef=pos,
        use_topr_neg_loss_coef=neg,
        use_kl_loss=True,
        kl_loss_coef=0.3,
        kl_penalty="k3",
        reference=ROLE,
    )
    settings = config.actor_settings()
    assert (settings.rl_loss_coef, settings.positive_loss_coef, settings.topr_negative_loss_coef) == (rl, pos, neg)
    torch.manual_seed(1)
    logits = torch.randn(4, 7, 11)
    batch = scored_batch([1.0, 0.0, 2.0, -1.0])
    batch.batch["responses"] = torch.randint(0, 11, (4, 4))
    batch.batch["advantages"] = torch.randn(4, 4)
    n = sum(sum(row) for row in MASK)
    loss, metrics = actor_loss(settings, batch, logits, LossScale(num_tokens=n, num_seqs=4), on_policy=False)
    lp = torch.log_softmax(logits[:, 2:-1], -1).gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)
    lp, old, ref = lp.tolist(), batch.batch["old_log_probs"].tolist(), batch.batch["ref_log_probs"].tolist()
    adv, scores = batch.batch["advantages"].tolist(), [1.0, 0.0, 2.0, -1.0]
    pg = kl = extra = 0.0
    for i in range(4):
        for t in range(4):
            if not MASK[i][t]:
                continue
            pg += -adv[i][t] * lp[i][t] / n
            kl += min(math.exp(ref[i][t] - lp[i][t]) - (ref[i][t] - lp[i][t]) - 1, 10.0) / n  # k3, clamped
            if scores[i] > 0:
                extra += pos * -adv[i][t] * lp[i][t] / n
            else:
                extra += neg * -min(max(math.exp(lp[i][t] - old[i][t]), 0.0), 1.0) * adv[i][t] * lp[i][t] / n
    expected = rl * (pg + 0.3 * kl) + extra
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    # a share of the mini-batch's loss (SHARE): the strategy sums it over micro-batches and ranks
    assert metrics["actor/total_loss@share"] == pytest.approx(expected, abs=1e-6)
    assert ("actor/topr_neg_loss@share" in metrics) == (neg > 0) and ("actor/positive_loss@share" in metrics) == (
        pos > 0
    )


def test_rolls_topr_keys_translate_into_policy_loss() -> None:
    data = {
        "adv_estimator": "reinforce",
        "rewards": {"math": {"reward_type": "math"}},
        "actor_train": {**ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
        "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
        "rl_loss_coef": 0.0,
        "use_topr_neg_loss_coef": 0.5,
        "postive_loss_coef": 1.5,
        "use_topr_loss": True,
    }
    translation = translate(data)
    assert translation.problems == []
    rows = {row.key: row for row in translation.rows}
    assert rows["rl_loss_coef"].status == "mapped" and rows["use_topr_loss"].status == "ignored"
    config = RLVRConfig.model_validate(translation.data)
    loss = config.policy_loss
    assert (loss.rl_loss_coef, loss.positive_loss_coef, loss.topr_negative_loss_coef) == (0.0, 1.5, 0.5)
    with pytest.raises(ValueError, match="topr_negative_loss_coef"):  # ROLL's docs example's placeholder
        RLVRConfig.model_validate(translate({**data, "use_topr_neg_loss_coef": "x_2"}).data)


# --- train_infer_correction.filters ------------------------------------------------------------------------------
def test_train_infer_filters_leave_the_loss_and_are_counted() -> None:
    rule = {"enabled": True, "agg_type": "token", "ratio_low": 0.8, "ratio_high": 1.25}
    config = make_config(correction={"filters": [rule, {"enabled": False, "ratio_low": 5.0, "ratio_high": 6.0}]})
    assert config.recompute_old_log_probs(1)  # the filters compare recomputed log-probs with the engine's
    batch = scored_batch([1.0, 0.0, 1.0, 1.0])
    old, infer = batch.batch["old_log_probs"].tolist(), batch.batch["rollout_log_probs"].tolist()
    metrics = compute_training_targets(batch, config, 0.0)
    expected = [
        [float(MASK[i][t] and 0.8 <= math.exp(old[i][t] - infer[i][t]) <= 1.25) for t in range(4)] for i in range(4)
    ]
    assert batch.batch["response_mask"].tolist() == expected
    dropped = sum(MASK[i][t] - expected[i][t] for i in range(4) for t in range(4))
    assert dropped > 0 and metrics["actor/train_infer_masked_tokens"] == dropped
    assert metrics["actor/train_infer_final_mask_mean"] == pytest.approx(1 - dropped / 10, abs=1e-6)


def test_rolls_train_infer_correction_filters_translate() -> None:
    filters = [{"enabled": True, "agg_type": "geometric", "ratio_low": 0.9, "ratio_high": 1.1, "diff_enabled": True}]
    data = {
        "adv_estimator": "reinforce",
        "rewards": {"math": {"reward_type": "math"}},
        "actor_train": {**ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
        "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
        "train_infer_correction": {"is_weight": {"enabled": False}, "filters": filters},
    }
    translation = translate(data)
    assert translation.problems == []
    config = RLVRConfig.model_validate(translation.data)
    (rule,) = config.correction.filter_rules
    assert (rule.agg_type, rule.ratio_low, rule.ratio_high, rule.diff_enabled) == ("geometric", 0.9, 1.1, True)
    assert config.advantage.domain_stats  # ROLL's per-domain statistics, written in for ROLL files


# --- per-domain statistics ---------------------------------------------------------------------------------------
def _normalized(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return [(v - mean) / (std + 1e-6) for v in values]


@pytest.mark.parametrize("per_domain", [True, False])
def test_batch_statistics_are_per_domain_as_roll(per_domain: bool) -> None:
    scores, tags = [1.0, 0.0, 0.2, 0.6], ["math", "math", "code", "code"]
    config = make_config(
        adv_estimator="reinforce", norm_mean_type="batch", norm_std_type="batch", advantage={"domain_stats": per_domain}
    )
    batch = scored_batch(scores, tags)
    metrics = compute_training_targets(batch, config, 0.0)
    expected = _normalized(scores[:2]) + _normalized(scores[2:]) if per_domain else _normalized(scores)
    # reinforce, gamma 1: every valid token carries its row's normalized score
    assert batch.batch["advantages"][:, 0].tolist() == pytest.approx(expected, abs=1e-6)
    assert (batch.batch["advantages"] * (1 - batch.batch["response_mask"])).abs().sum() == 0
    if per_domain:
        assert metrics["rollout/truncated_frac/math"] == 0.0 and "actor/advantage_mean/code" in metrics


def test_advantage_whitening_is_per_domain_with_domain_stats() -> None:
    scores, tags = [1.0, 0.0, 0.2, 0.6], ["code", "math", "code", "math"]
    config = make_config(adv_estimator="reinforce", whiten_advantages=True, advantage={"domain_stats": True})
    batch = scored_batch(scores, tags)
    compute_training_targets(batch, config, 0.0)
    adv = batch.batch["advantages"]
    for domain in ("math", "code"):
        rows = [i for i, tag in enumerate(tags) if tag == domain]
        values = [float(adv[i, t]) for i in rows for t in range(4) if MASK[i][t]]
        assert sum(values) / len(values) == pytest.approx(0.0, abs=1e-5)  # whitened within the domain
        mean = sum(values) / len(values)
        assert sum((v - mean) ** 2 for v in values) / (len(values) - 1) == pytest.approx(1.0, abs=1e-4)


# --- reward_clip: after normalization, and on the token rewards ----------------------------------------------------
def test_reward_clip_follows_normalization_as_roll() -> None:
    config = make_config(adv_estimator="reinforce", norm_mean_type="batch", norm_std_type="batch", reward_clip=1.0)
    batch = scored_batch([3.0, 0.0, 0.0, 0.0])
    metrics = compute_training_targets(batch, config, 0.0)
    # normalized (3, 0, 0, 0): mean 0.75, std 1.5 -> (1.5, -0.5, -0.5, -0.5), then clipped to 1.0
    expected = [min(max(v, -1.0), 1.0) for v in _normalized([3.0, 0.0, 0.0, 0.0])]
    assert batch.batch["advantages"][:, 0].tolist() == pytest.approx(expected, abs=1e-6)
    assert metrics["critic/reward_clip_frac"] == 0.25


def test_reward_clip_also_clamps_token_rewards_with_the_kl_penalty() -> None:
    config = make_config(
        adv_estimator="reinforce", reward_clip=0.5, add_token_level_kl=True, init_kl_coef=2.0, kl_penalty="kl",
        reference=ROLE,
    )  # fmt: skip
    batch = scored_batch([1.0, 0.0, 0.3, -2.0])
    old, ref = batch.batch["old_log_probs"].tolist(), batch.batch["ref_log_probs"].tolist()
    metrics = compute_training_targets(batch, config, 2.0)
    scores = [0.5, 0.0, 0.3, -0.5]  # response-level clip first
    beyond = []
    for i in range(4):
        last = max(t for t in range(4) if MASK[i][t])
        for t in range(4):
            raw = (scores[i] if t == last else 0.0) - 2.0 * (old[i][t] - ref[i][t]) if MASK[i][t] else 0.0
            got = float(batch.batch["token_level_rewards"][i, t])
            assert got == pytest.approx(min(max(raw, -0.5), 0.5), abs=1e-6)
            if MASK[i][t]:
                beyond.append(abs(raw) > 0.5)
    # the share of the response's tokens clipped: padding is not counted as unclipped
    assert metrics["critic/token_reward_clip_frac"] == pytest.approx(sum(beyond) / len(beyond))
    kl = kl_penalty(batch.batch["old_log_probs"], batch.batch["ref_log_probs"], "kl")
    assert kl.abs().max() > 0.25  # the fixture does reach the token clip


# --- kl_penalty: full ----------------------------------------------------------------------------------------------
def _dist(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.log_softmax(torch.randn(*shape), -1)


def _full_kl(p: list[float], q: list[float]) -> float:
    return sum(math.exp(a) * (a - b) for a, b in zip(p, q))


def test_full_kl_in_the_reward_uses_whole_distributions() -> None:
    config = make_config(
        adv_estimator="reinforce", add_token_level_kl=True, init_kl_coef=0.5, kl_penalty="full", reference=ROLE
    )
    assert config.reference_settings().full_distribution and config.recompute_old_log_probs(1)
    assert config.actor_settings().kl_penalty == "full"
    batch = scored_batch([1.0, 0.0, 1.0, 1.0])
    old_full, ref_full = _dist(3, (4, 4, 6)), _dist(4, (4, 4, 6))
    batch.batch["old_full_log_probs"], batch.batch["ref_full_log_probs"] = old_full, ref_full
    metrics = compute_training_targets(batch, config, 0.5)
    kl = [[_full_kl(old_full[i, t].tolist(), ref_full[i, t].tolist()) for t in range(4)] for i in range(4)]
    for i in range(4):
        last = max(t for t in range(4) if MASK[i][t])
        for t in range(4):
            raw = ((1.0 if i != 1 else 0.0) if t == last else 0.0) - 0.5 * kl[i][t] if MASK[i][t] else 0.0
            assert float(batch.batch["token_level_rewards"][i, t]) == pytest.approx(raw, abs=1e-6)
    n = sum(sum(row) for row in MASK)
    assert metrics["actor/kl"] == pytest.approx(sum(kl[i][t] * MASK[i][t] for i in range(4) for t in range(4)) / n)
    # the distributions are dropped once used (no KL loss needs the reference's)
    assert "old_full_log_probs" not in batch.batch.keys() and "ref_full_log_probs" not in batch.batch.keys()


def test_full_kl_loss_against_the_references_distributions() -> None:
    config = make_config(pg_variant="vanilla", use_kl_loss=True, kl_loss_coef=0.2, kl_penalty="full", reference=ROLE)
    settings = config.actor_settings()
    torch.manual_seed(5)
    logits = torch.randn(4, 7, 6)
    batch = scored_batch([1.0, 0.0, 1.0, 1.0])
    batch.batch["responses"] = torch.randint(0, 6, (4, 4))
    batch.batch["advantages"] = torch.randn(4, 4)
    batch.batch["ref_full_log_probs"] = _dist(6, (4, 4, 6))
    n = sum(sum(row) for row in MASK)
    loss, metrics = actor_loss(settings, batch, logits, LossScale(num_tokens=n, num_seqs=4), on_policy=True)
    full = torch.log_softmax(logits[:, 2:-1], -1)
    lp = full.gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)
    pg = kl = 0.0
    for i in range(4):
        for t in range(4):
            if MASK[i][t]:
                pg += -float(batch.batch["advantages"][i, t]) * float(lp[i, t]) / n
                kl += _full_kl(full[i, t].tolist(), batch.batch["ref_full_log_probs"][i, t].tolist()) / n
    assert float(loss) == pytest.approx(pg + 0.2 * kl, abs=1e-6)
    assert metrics["actor/kl_loss@share"] == pytest.approx(kl, abs=1e-6)


def test_rolls_kl_penalty_full_translates() -> None:
    data = {
        "adv_estimator": "reinforce",
        "rewards": {"math": {"reward_type": "math"}},
        "actor_train": {**ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
        "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
        "kl_penalty": "full",
    }
    translation = translate(data)
    assert translation.problems == [] and {row.key: row for row in translation.rows}["kl_penalty"].status == "mapped"
    config = RLVRConfig.model_validate(translation.data)
    # ROLL: kl_penalty shapes the reward's KL; its actor's KL loss is always k3
    assert config.kl.penalty == "full" and config.kl.loss_penalty == "k3" and config.actor_settings().kl_penalty == "k3"
    assert config.reference_settings().full_distribution


def test_full_kl_refuses_distributions_too_large_to_ship(monkeypatch) -> None:
    from roll.pipelines.rlvr.workers import _check_full_distribution_size
    from roll.runtime import ConfigError

    _check_full_distribution_size(8, 64, 512)  # 1 MiB: fine
    with pytest.raises(ConfigError, match=r"kl.penalty='full'.*151936 vocabulary.*k3 or low_var_kl"):
        _check_full_distribution_size(64, 4096, 151936)  # ~148 GiB
    monkeypatch.setenv("ROLL_FULL_KL_MAX_GIB", "0.0001")
    with pytest.raises(ConfigError, match="ROLL_FULL_KL_MAX_GIB=0.0001"):
        _check_full_distribution_size(8, 64, 512)
