"""RLVR driver-side logic without Ray: training targets, prompt mixing, reward routing, config checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roll.pipelines.algorithms import grpo_advantages, kl_penalty, rloo_advantages
from roll.pipelines.data import PromptCollator
from roll.pipelines.rewards import CodeSandboxRewardWorker, MathRewardWorker
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.rollout import PromptSource, Rollouts, _quotas, check_reward_fields
from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import LossScale

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}


def scored_batch() -> DataProto:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    torch.manual_seed(0)
    return DataProto.from_dict(
        {
            "response_mask": mask,
            "scores": torch.tensor([1.0, 0.0, 1.0, 1.0]),
            "group_index": torch.tensor([0, 0, 1, 1]),
            "old_log_probs": torch.randn(4, 4),
            "ref_log_probs": torch.randn(4, 4),
            "rollout_log_probs": torch.randn(4, 4),
        },
        {"finish_reason": ["stop", "length", "stop", "stop"]},
    )


def test_grpo_targets_match_the_estimator_and_mask_truncated_rows(make_config):
    batch = scored_batch()
    expected, _ = grpo_advantages(batch.batch["scores"], batch.batch["response_mask"], batch.batch["group_index"])
    metrics = compute_training_targets(batch, make_config(mask_truncated=True, use_kl_loss=True, reference=ROLE), 0.0)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0]).unsqueeze(-1)
    torch.testing.assert_close(batch.batch["advantages"], expected * keep)
    assert batch.batch["response_mask"][1].sum() == 0  # the truncated sample leaves the loss
    kl = kl_penalty(batch.batch["old_log_probs"], batch.batch["ref_log_probs"], "k3")
    mask = scored_batch().batch["response_mask"].float()
    assert metrics["actor/kl"] == pytest.approx(float((kl * mask).sum() / mask.sum()), rel=1e-6)
    assert metrics["rollout/truncated_frac"] == 0.25


def test_rloo_overlong_penalty_kl_in_reward_and_tis(make_config):
    batch = scored_batch()
    config = make_config(
        adv_estimator="rloo",
        overlong_buffer_len=2,
        overlong_penalty_factor=1.0,
        tis_cap=2.0,
        add_token_level_kl=True,
        reference=ROLE,
    )
    compute_training_targets(batch, config, kl_coef=0.1)
    # Lengths 3, 4, 2, 1 with a 2-token buffer before 4: -0.5 at length 3, -1.0 at length 4.
    scores = torch.tensor([1.0 - 0.5, 0.0 - 1.0, 1.0, 1.0])
    expected, _ = rloo_advantages(scores, scored_batch().batch["response_mask"], batch.batch["group_index"])
    torch.testing.assert_close(batch.batch["advantages"], expected)
    kl = kl_penalty(scored_batch().batch["old_log_probs"], scored_batch().batch["ref_log_probs"], "k3")
    mask = scored_batch().batch["response_mask"].float()
    token_rewards = batch.batch["token_level_rewards"]
    torch.testing.assert_close(token_rewards[0, :2], -0.1 * kl[0, :2])
    assert batch.batch["is_weights"].shape == (4, 4) and float(batch.batch["is_weights"].max()) <= 2.0
    assert (batch.batch["is_weights"] * (1 - mask)).abs().sum() == 0


def test_quotas_sum_exactly_and_follow_probabilities():
    assert _quotas(10, {"a": 0.5, "b": 0.3, "c": 0.2}) == {"a": 5, "b": 3, "c": 2}
    assert sum(_quotas(7, {"a": 1, "b": 1, "c": 1}).values()) == 7


def test_prompt_source_mixes_domains_and_resumes(make_config):
    examples = [{"prompt_ids": [5, 6], "prompt": f"q{i}", "tag": "math" if i % 3 else "code"} for i in range(30)]
    rewards = make_config(rewards={"math": {"reward_type": "math"}, "code": {"reward_type": "code"}}).rewards
    collator = PromptCollator(0, 4)
    source = PromptSource(examples, rewards, {"math": 0.75, "code": 0.25}, collator, batch_size=8, seed=1)
    first = source.next_batch()
    assert sorted(first["tag"].tolist()) == ["code"] * 2 + ["math"] * 6
    state = source.state_dict()
    second = source.next_batch()["prompt"].tolist()
    again = PromptSource(examples, rewards, {"math": 0.75, "code": 0.25}, collator, batch_size=8, seed=1)
    again.load_state_dict(state)
    assert again.next_batch()["prompt"].tolist() == second


def test_unroutable_tags_and_missing_reward_fields_fail_at_load_time(make_config):
    rewards = make_config().rewards
    with pytest.raises(ConfigError, match="tag 'chess', which no reward domain accepts"):
        PromptSource([{"prompt_ids": [1], "tag": "chess"}], rewards, None, PromptCollator(0, 2), batch_size=1, seed=0)
    with pytest.raises(ConfigError, match="needs a 'ground_truth' field.*extra_keys"):
        check_reward_fields([{"prompt": "q", "tag": "math"}], rewards, {"math": MathRewardWorker})
    code_rewards = make_config(rewards={"code": {"reward_type": "code"}}).rewards
    check_reward_fields([{"tests": "assert True", "tag": "code"}], code_rewards, {"code": CodeSandboxRewardWorker})


class _FakeRewards:
    def __init__(self, value: float):
        self.value = value

    def compute_rewards(self, batch, blocking=False):
        value = self.value

        class Pending:
            def materialize(self):
                return DataProto.from_dict(
                    {"scores": torch.full((len(batch),), value)}, {"reward_info": [f"v{value}"] * len(batch)}
                )

        return Pending()


def test_scores_are_routed_by_tag_and_written_back_in_order(make_config):
    rewards = make_config(
        rewards={"math": {"reward_type": "math"}, "code": {"reward_type": "code", "tag_included": ["py"]}}
    ).rewards
    rollouts = Rollouts(None, {"math": _FakeRewards(1.0), "code": _FakeRewards(0.5)}, rewards, tokenizer=None)
    batch = DataProto.from_dict({"x": torch.zeros(4)}, {"tag": ["math", "py", "py", "math"]})
    out = rollouts.score(batch)
    assert out["scores"].tolist() == [1.0, 0.5, 0.5, 1.0]
    assert out["reward_info"].tolist() == ["v1.0", "v0.5", "v0.5", "v1.0"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"adv_estimator": "gae"}, "needs a critic"),
        ({"use_kl_loss": True}, "no reference role"),
        ({"actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 1}}}, "num_return_sequences >= 2"),
        ({"domain_interleave_probs": {"chess": 1.0}}, "not reward domains"),
        ({"kl_ctrl_type": "adaptive"}, "needs kl.target and kl.horizon"),
        ({"rewards": {}}, "at least one domain"),
    ],
)
def test_config_checks(overrides, message, make_config):
    with pytest.raises(ConfigError, match=message):
        make_config(**overrides)


def test_lr_schedule_length_counts_every_update(make_config):
    config = make_config(rollout_batch_size=8, ppo_mini_batch_size=4, ppo_epochs=2, max_steps=10)
    # 8 prompts x 2 samples = 16 samples, 4 per update -> 4 updates per epoch, 2 epochs, 10 steps.
    assert config.actor_train.training_args.max_steps == 80
    assert config.actor_infer.generating_args.max_new_tokens == config.rollout.response_length == 4


@pytest.mark.parametrize(
    ("overrides", "mini_batches", "expected"),
    [
        ({}, 1, False),  # one on-policy step: the training forward is the old policy
        ({}, 2, True),  # the second mini-batch trains on a policy the first one changed
        ({"ppo_epochs": 2}, 1, True),
        ({"tis_cap": 2.0}, 1, True),  # truncated IS compares training-side and rollout log-probs up front
        ({"reference": ROLE, "add_token_level_kl": True, "init_kl_coef": 0.1}, 1, True),  # KL enters the rewards
        ({"reference": ROLE, "use_kl_loss": True}, 1, False),  # KL in the loss uses the live log-probs
        ({"enable_old_logprobs_recompute": True}, 1, True),
        ({"enable_old_logprobs_recompute": False}, 2, False),
    ],
)
def test_old_log_probs_are_recomputed_only_when_the_update_is_not_on_policy(
    overrides, mini_batches, expected, make_config
):
    assert make_config(**overrides).recompute_old_log_probs(mini_batches) is expected


def test_on_policy_loss_without_recompute_equals_the_loss_with_recomputed_old_log_probs(make_config):
    from roll.pipelines.rlvr.workers import actor_loss

    config = make_config(pg_clip_low=0.2, pg_clip_high=0.28, importance_sampling="sequence", entropy_loss_coef=0.01)
    settings = config.actor_settings()
    assert (settings.clip_low, settings.clip_high, settings.temperature) == (0.2, 0.28, 1.0)
    torch.manual_seed(0)
    prompt, response, vocab = 3, 4, 11
    logits = torch.randn(4, prompt + response, vocab, requires_grad=True)
    batch = scored_batch()
    batch.batch["responses"] = torch.randint(0, vocab, (4, response))
    batch.batch["advantages"] = torch.randn(4, response) * batch.batch["response_mask"]
    scale = LossScale(num_tokens=int(batch.batch["response_mask"].sum()), num_seqs=4)
    with torch.no_grad():
        # What the recompute pass would have produced: the same weights' log-probs of the responses.
        predicting = logits[:, prompt - 1 : -1]
        recomputed = torch.log_softmax(predicting / 1.0, -1).gather(-1, batch.batch["responses"].unsqueeze(-1))
    batch.batch["old_log_probs"] = recomputed.squeeze(-1)

    loss_recomputed, metrics_recomputed = actor_loss(settings, batch, logits, scale, on_policy=False)
    (grad_recomputed,) = torch.autograd.grad(loss_recomputed, logits)
    batch.batch["old_log_probs"] = torch.randn(4, response)  # the rollout engine's; must be ignored
    loss_on_policy, metrics_on_policy = actor_loss(settings, batch, logits, scale, on_policy=True)
    (grad_on_policy,) = torch.autograd.grad(loss_on_policy, logits)

    torch.testing.assert_close(loss_on_policy, loss_recomputed, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_on_policy, grad_recomputed, atol=1e-6, rtol=0)
    assert metrics_on_policy["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-7)
    assert "actor/entropy" in metrics_on_policy and "actor/entropy" not in metrics_recomputed


@pytest.mark.parametrize("variant", ["vanilla", "tis", "topr", "cispo", "kimi15"])
def test_actor_loss_runs_the_configured_pg_variant(variant, make_config):
    from roll.pipelines.algorithms.pg_variants import PGVariantParams, pg_variant_loss
    from roll.pipelines.rlvr.workers import actor_loss

    settings = make_config(pg_variant=variant, topr_negative_weight=0.5).actor_settings()
    assert settings.pg_variant == variant and settings.pg_params.topr_negative_weight == 0.5
    torch.manual_seed(1)
    prompt, response, vocab = 3, 4, 11
    logits = torch.randn(4, prompt + response, vocab)
    batch = scored_batch()
    batch.batch["responses"] = torch.randint(0, vocab, (4, response))
    batch.batch["advantages"] = torch.randn(4, response) * batch.batch["response_mask"]
    batch.batch["old_log_probs"] = torch.randn(4, response) * 0.1 - 1.0
    scale = LossScale(num_tokens=int(batch.batch["response_mask"].sum()), num_seqs=4)
    loss, metrics = actor_loss(settings, batch, logits, scale, on_policy=False)
    log_probs = torch.log_softmax(logits[:, prompt - 1 : -1], -1).gather(-1, batch.batch["responses"].unsqueeze(-1))
    expected, _ = pg_variant_loss(
        variant,
        log_probs.squeeze(-1),
        batch.batch["old_log_probs"],
        batch.batch["advantages"],
        batch.batch["response_mask"],
        scores=batch.batch["scores"],
        params=PGVariantParams(topr_negative_weight=0.5),
        num_tokens=scale.num_tokens,
        num_seqs=scale.num_seqs,
    )
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=0)
    assert metrics["actor/pg_loss@share"] == pytest.approx(float(expected), abs=1e-6)


def _tagged(batch: DataProto, tags: list[str]) -> DataProto:
    batch.non_tensor_batch["tag"] = np.array(tags, dtype=object)
    return batch


def test_running_reward_norm_keeps_one_moment_per_domain(make_config):
    from roll.pipelines.algorithms.roll_knobs import RunningMoments

    config = make_config(
        adv_estimator="reinforce",
        norm_mean_type="running",
        norm_std_type="running",
        rewards={"math": {"reward_type": "math"}, "code": {"reward_type": "code"}},
    )
    running = {"math": RunningMoments(), "code": RunningMoments()}
    running["math"].update(torch.tensor([0.0, 0.0, 1.0]))  # an earlier step
    batch = _tagged(scored_batch(), ["math", "math", "code", "code"])
    compute_training_targets(batch, config, 0.0, running)
    seen_math = [0.0, 0.0, 1.0, 1.0, 0.0]
    mean = sum(seen_math) / 5
    std = (sum((x - mean) ** 2 for x in seen_math) / 4) ** 0.5
    # reinforce (gamma 1): every valid token carries the normalized score
    assert float(batch.batch["advantages"][0, 0]) == pytest.approx((1.0 - mean) / (std + 1e-6), abs=1e-6)
    assert running["code"].mean == pytest.approx(1.0) and running["math"].count == pytest.approx(5)
    # code's two scores are both 1: (1 - 1) / (0 + 1e-6) = 0
    assert float(batch.batch["advantages"][2, 0]) == pytest.approx(0.0, abs=1e-6)


def test_whiten_rewards_under_grpo_runs_rolls_grpo(make_config):
    from roll.pipelines.algorithms.rewards import token_level_rewards_from_scores
    from roll.pipelines.algorithms.roll_knobs import reinforce_returns, whiten_token_rewards

    batch = _tagged(scored_batch(), ["math"] * 4)
    compute_training_targets(batch, make_config(adv_estimator="grpo", whiten_rewards=True), 0.0)
    scores = scored_batch().batch["scores"]
    mask = scored_batch().batch["response_mask"].float()
    normalized = torch.tensor([(1.0 - 0.5) / (0.7071067811865476 + 1e-6), (0.0 - 0.5) / (0.7071067811865476 + 1e-6)])
    normalized = torch.cat([normalized, torch.zeros(2)])  # group 1: both 1.0 -> 0
    assert scores.tolist() == [1.0, 0.0, 1.0, 1.0]
    tokens = whiten_token_rewards(token_level_rewards_from_scores(normalized, mask), mask)
    expected, _ = reinforce_returns(tokens, mask, 1.0)
    torch.testing.assert_close(batch.batch["advantages"], expected, atol=1e-6, rtol=0)


def test_whiten_rewards_rejects_estimators_roll_lacks(make_config):
    with pytest.raises(ValueError, match="whiten_rewards"):
        make_config(adv_estimator="rloo", whiten_rewards=True)


def test_query_filter_drops_groups_per_domain(make_config):
    rewards = make_config(
        rewards={
            "math": {"reward_type": "math", "query_filter_config": {"type": "std_filter"}},
            "code": {
                "reward_type": "code",
                "query_filter_config": {"type": "mean_filter", "filter_args": {"threshold_up": 0.9}},
            },
        }
    ).rewards
    rollouts = Rollouts(None, {}, rewards, tokenizer=None)
    batch = DataProto.from_dict(
        {"scores": torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0]), "group_index": torch.tensor([0, 0, 1, 1, 2, 2])},
        {"tag": ["math", "math", "math", "math", "code", "code"]},
    )
    # math: std_filter with ROLL's default threshold -1 keeps everything; code: mean 1.0 >= 0.9 is dropped
    assert rollouts.query_filter_keep(batch).tolist() == [True, True, True, True, False, False]


def test_length_and_difficulty_weights_weigh_the_policy_loss(make_config):
    from roll.pipelines.rlvr.workers import actor_loss

    config = make_config(length_loss_weight=True, difficulty_loss_weight=True, pg_variant="vanilla")
    batch = _tagged(scored_batch(), ["math"] * 4)
    batch.non_tensor_batch["difficulty"] = np.array([0.0, 1.0, 0.5, 0.5], dtype=object)
    compute_training_targets(batch, config, 0.0)
    assert batch.batch["response_lengths"].tolist() == [3.0, 4.0, 2.0, 1.0]
    torch.manual_seed(2)
    logits = torch.randn(4, 7, 11)
    batch.batch["responses"] = torch.randint(0, 11, (4, 4))
    batch.batch["advantages"] = torch.randn(4, 4) * batch.batch["response_mask"]
    scale = LossScale(num_tokens=int(batch.batch["response_mask"].sum()), num_seqs=4)
    weighted, _ = actor_loss(config.actor_settings(), batch, logits, scale, on_policy=True)
    plain, _ = actor_loss(make_config(pg_variant="vanilla").actor_settings(), batch, logits, scale, on_policy=True)
    log_probs = torch.log_softmax(logits[:, 2:-1], -1).gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)
    raw = [(0.5 + 1.5 * d) * (1.5 - (n - 1) / (3 + 1e-8)) for d, n in zip([0.0, 1.0, 0.5, 0.5], [3, 4, 2, 1])]
    w = torch.tensor([x * 4 / (sum(raw) + 1e-8) for x in raw]).unsqueeze(-1)
    mask = batch.batch["response_mask"].float()
    expected = (-batch.batch["advantages"] * log_probs * w * mask).sum() / mask.sum()
    torch.testing.assert_close(weighted, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(weighted, plain)


def test_difficulty_weight_needs_the_column(make_config):
    batch = _tagged(scored_batch(), ["math"] * 4)
    with pytest.raises(ConfigError, match="extra_keys"):
        compute_training_targets(batch, make_config(difficulty_loss_weight=True), 0.0)
