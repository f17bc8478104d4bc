"""Training targets of agentic samples: trajectory-wise GRPO / agentic_reinforce and step-wise GiGPO, on
hand-made batches whose expected values are computed independently here."""

from __future__ import annotations

import pytest
import torch

from roll.agentic.pipeline import AgenticConfig, adjust_batch
from roll.agentic.pipeline.advantage import attach_step_returns, compute_agentic_targets, turn_rewards_to_tokens
from roll.agentic.pipeline.workers import AgenticActorSettings, agentic_actor_loss
from roll.protocol import DataProto
from roll.strategies import LossScale

ROLE = {"model_name_or_path": "/models/tiny"}


def _config(manager: str, **extra) -> AgenticConfig:
    return AgenticConfig.model_validate(
        {
            "actor_train": {"model_args": ROLE},
            "actor_infer": {"model_args": ROLE},
            "custom_envs": {"Lake": {"env_type": "frozen_lake", "env_manager_cls": manager}},
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
            "rollout_batch_size": 4,
            **extra,
        }
    )


def _batch(mask: list[list[int]], scores: list[float], **columns) -> DataProto:
    mask_t = torch.tensor(mask)
    n, width = mask_t.shape
    tensors = {"response_mask": mask_t, "scores": torch.tensor(scores), "responses": torch.zeros(n, width).long()}
    return DataProto.from_dict(tensors, {k: list(v) for k, v in columns.items()})


def test_traj_grpo_gives_every_assistant_token_the_group_normalized_episode_score():
    # two groups of two episodes; env tokens (mask 0) in the middle of row 0
    batch = _batch(
        [[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]],
        [1.0, 0.0, 0.5, 0.5],
        traj_group_id=["g0", "g0", "g1", "g1"],
    )
    compute_agentic_targets(batch, _config("traj"))
    adv = batch.batch["advantages"]
    # group g0: scores (1, 0) -> mean 0.5, unbiased std 0.7071 -> +-0.7071; g1 has no spread -> 0
    expected = torch.tensor([0.70710, -0.70710, 0.0, 0.0])
    mask = batch.batch["response_mask"].bool()
    for row in range(4):
        assert torch.allclose(adv[row][mask[row]], expected[row].expand(int(mask[row].sum())), atol=1e-4)
        assert torch.all(adv[row][~mask[row]] == 0)  # env tokens and padding get nothing


def test_agentic_reinforce_discounts_per_turn():
    mask = torch.tensor([[1, 1, 0, 1, 0, 1, 1]])
    rewards = turn_rewards_to_tokens([[0.0, 0.5, 1.0]], mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 1.0]]
    batch = _batch(mask.tolist(), [1.5], traj_group_id=["g"], step_scores=[[0.0, 0.5, 1.0]])
    compute_agentic_targets(batch, _config("traj", adv_estimator="agentic_reinforce", gamma=0.5))
    # turn returns: G3 = 1, G2 = 0.5 + 0.5 * 1 = 1, G1 = 0 + 0.5 * 1 = 0.5
    assert batch.batch["advantages"].tolist() == [[0.5, 0.5, 0.0, 1.0, 0.0, 1.0, 1.0]]


def test_turn_rewards_must_match_the_assistant_segments():
    with pytest.raises(Exception, match="2 turn rewards for 1 assistant segments"):
        turn_rewards_to_tokens([[1.0, 2.0]], torch.tensor([[1, 1, 0]]))


def test_step_gigpo_adds_episode_and_state_group_parts():
    # one episode group with two episodes; episode A: states s0 -> s1 (reward 1 at the end), B: s0 -> s2 (0)
    batch = _batch(
        [[1, 1]] * 4,
        [0.0, 1.0, 0.0, 0.0],
        traj_group_id=["g"] * 4,
        traj_id=["A", "A", "B", "B"],
        step=[0, 1, 0, 1],
        state_hash=["s0", "s1", "s0", "s2"],
        episode_scores=[1.0, 1.0, 0.0, 0.0],
    )
    config = _config("step", adv_estimator="gigpo", step_reward_gamma=0.5, step_reward_weight=2.0)
    metrics = compute_agentic_targets(batch, config)
    # episode part, over the group's step rows (1, 1, 0, 0): mean 0.5, unbiased std 0.5774 -> +-0.8660;
    # step returns: A (0.5, 1), B (0, 0); state group s0 holds A0 (0.5) and B0 (0) -> +-0.7071; s1, s2 singletons -> 0
    expected = [0.86603 + 2 * 0.70711, 0.86603, -0.86603 - 2 * 0.70711, -0.86603]
    assert torch.allclose(batch.batch["advantages"][:, 0], torch.tensor(expected), atol=1e-4)
    assert metrics["advantage/state_groups"] == 3.0


@pytest.mark.parametrize("mode", ["copy", "delete", "random_sample"])
@pytest.mark.parametrize("estimator", ["gigpo", "step_reinforce", "grpo"])
def test_step_returns_are_taken_before_the_batch_is_adjusted(mode: str, estimator: str):
    """Step-wise rows adjusted to split over 2 ranks (ROLL's order: returns first, then adjust_batch): copied rows
    (the same turn twice) still get targets, and a dropped final turn does not take its reward from the returns of
    the turns kept."""
    # episode A: 3 turns, the reward on the last; B: 2 turns, no reward -> 5 rows, odd
    whole = _batch(
        [[1, 1]] * 5,
        [0.0, 0.0, 1.0, 0.0, 0.0],
        traj_group_id=["g"] * 5,
        traj_id=["A", "A", "A", "B", "B"],
        step=[0, 1, 2, 0, 1],
        state_hash=["s0", "s1", "s2", "s0", "s3"],
        episode_scores=[1.0, 1.0, 1.0, 0.0, 0.0],
    )
    config = _config("step", adv_estimator=estimator, step_reward_gamma=0.5)
    attach_step_returns(whole, config)
    if estimator == "grpo":  # the episode score alone: nothing to attach
        assert "step_returns" not in whole.batch.keys()
    else:
        assert whole.batch["step_returns"].tolist() == [0.25, 0.5, 1.0, 0.0, 0.0]
    adjusted = adjust_batch(whole, 2, mode, unit=4, seed=1)  # random_sample with seed 1 drops A's last turn
    assert len(adjusted) % 2 == 0
    compute_agentic_targets(adjusted, config)  # copied turns used to fail: "two rows with the same step_index"
    if estimator != "grpo":
        kept = [(t, int(k)) for t, k in zip(adjusted.non_tensor_batch["traj_id"], adjusted.non_tensor_batch["step"])]
        returns = {("A", 0): 0.25, ("A", 1): 0.5, ("A", 2): 1.0, ("B", 0): 0.0, ("B", 1): 0.0}
        assert adjusted.batch["step_returns"].tolist() == [returns[row] for row in kept]


def test_adjust_batch_deletes_or_copies_rows_to_a_multiple():
    batch = _batch([[1]] * 5, [0.0, 1.0, 2.0, 3.0, 4.0], traj_id=list("abcde"))
    assert adjust_batch(batch, 2, "delete").batch["scores"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert adjust_batch(batch, 2, "copy").batch["scores"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]
    assert len(adjust_batch(batch, 5, "none")) == 5
    with pytest.raises(Exception, match="batch_adjust_mode"):
        adjust_batch(batch, 2, "none")


def _kl_batch(scores: list[float], **columns) -> DataProto:
    batch = _batch([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]], scores, traj_group_id=["g", "g"], **columns)
    batch.batch["old_log_probs"] = torch.tensor([[-1.0, -2.0, -9.0, -0.5, 0.0], [-1.0, -1.0, -1.0, 0.0, 0.0]])
    batch.batch["ref_log_probs"] = torch.tensor([[-1.5, -1.0, -3.0, -0.5, 0.0], [-2.0, -1.0, -0.5, 0.0, 0.0]])
    return batch


def test_add_token_level_kl_subtracts_the_kl_from_every_assistant_tokens_reward():
    # ROLL (compute_token_reward): token rewards = score on the last token - coef x (old - ref) on every token,
    # then REINFORCE returns-to-go; the env token (column 2) carries nothing
    batch = _kl_batch([1.0, 0.0])
    config = _config("traj", reward_normalization={"grouping": "batch", "method": "identity"}, **_IN_REWARD_KL)
    metrics = compute_agentic_targets(batch, config, kl_coef=0.5)
    # k1 = old - ref: row 0 (0.5, -1.0, _, 0.0), row 1 (1.0, 0.0, -0.5)
    assert batch.batch["token_level_rewards"].tolist() == [[-0.25, 0.5, 0.0, 1.0, 0.0], [-0.5, 0.0, 0.25, 0.0, 0.0]]
    assert batch.batch["advantages"].tolist() == [[1.25, 1.5, 0.0, 1.0, 0.0], [-0.25, 0.25, 0.25, 0.0, 0.0]]
    assert metrics["actor/kl"] == pytest.approx((0.5 - 1.0 + 0.0 + 1.0 + 0.0 - 0.5) / 6)
    assert metrics["critic/kl_coef"] == 0.5


def test_add_token_level_kl_joins_the_turn_rewards_of_agentic_reinforce_and_the_rewards_of_gae():
    batch = _kl_batch([1.0, 0.0], step_scores=[[0.0, 1.0], [0.0]])
    compute_agentic_targets(batch, _config("traj", adv_estimator="agentic_reinforce", **_IN_REWARD_KL), kl_coef=0.5)
    # row 0: turn 1 = tokens 0-1 (kl reward -0.25 + 0.5), turn 2 = token 3 (1.0); gamma 1
    assert batch.batch["advantages"][0].tolist() == [1.25, 1.25, 0.0, 1.0, 0.0]
    gae = _kl_batch([1.0, 0.0])
    gae.batch["values"] = torch.zeros(2, 5)
    critic = {"model_args": {**ROLE, "model_head": "value"}}
    compute_agentic_targets(gae, _config("traj", adv_estimator="gae", critic=critic, **_IN_REWARD_KL), kl_coef=0.5)
    assert gae.batch["advantages"].tolist() == [[1.25, 1.5, 0.0, 1.0, 0.0], [-0.25, 0.25, 0.25, 0.0, 0.0]]


def test_without_add_token_level_kl_the_reference_only_serves_the_kl_loss():
    batch = _kl_batch([1.0, 0.0])
    config = _config(
        "traj",
        reward_normalization={"grouping": "batch", "method": "identity"},
        use_kl_loss=True,
        reference={"model_args": ROLE},
    )
    metrics = compute_agentic_targets(batch, config, kl_coef=0.5)
    assert batch.batch["advantages"].tolist() == [[1.0, 1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]
    assert "actor/kl" not in metrics
    with pytest.raises(ValueError, match="add_token_level_kl"):
        _config("traj", add_token_level_kl=True)  # no reference role


_IN_REWARD_KL = {"add_token_level_kl": True, "kl_penalty": "k1", "reference": {"model_args": ROLE}}


def test_reward_clip_clamps_the_normalized_rewards_as_roll():
    """ROLL's agentic reward_clip (compute_response_level_rewards): normalize first, then clamp to [-clip, clip]."""
    batch = _batch(
        [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], [3.0, -1.0, 0.5, 0.5], traj_group_id=["g0", "g0", "g1", "g1"]
    )
    config = _config("traj", reward_clip=0.5, reward_normalization={"grouping": "traj_group_id", "method": "mean"})
    assert config.advantage.reward_clip == 0.5  # the flat ROLL key reaches the advantage section
    metrics = compute_agentic_targets(batch, config)
    # mean only: g0 (3, -1) -> (2, -2) -> clipped (0.5, -0.5); g1 -> (0, 0)
    assert batch.batch["advantages"][:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert metrics["critic/reward_clip_frac"] == 0.5
    unclipped = _batch(
        [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], [3.0, -1.0, 0.5, 0.5], traj_group_id=["g0"] * 2 + ["g1"] * 2
    )
    compute_agentic_targets(
        unclipped, _config("traj", reward_normalization={"grouping": "traj_group_id", "method": "mean"})
    )
    assert unclipped.batch["advantages"][:, 0].tolist() == [2.0, -2.0, 0.0, 0.0]


def test_reward_clip_clamps_turn_rewards_of_agentic_reinforce():
    batch = _batch([[1, 0, 1]], [9.0], traj_group_id=["g"], step_scores=[[4.0, -3.0]])
    compute_agentic_targets(batch, _config("traj", adv_estimator="agentic_reinforce", gamma=1.0, reward_clip=2.0))
    # turn rewards (4, -3) -> (2, -2); returns: G2 = -2, G1 = 2 + -2 = 0
    assert batch.batch["advantages"].tolist() == [[0.0, 0.0, -2.0]]


def test_train_infer_segment_filter_drops_turns_from_the_loss():
    """ROLL's train_infer_correction filter (agg_type segment): a turn whose mean log-ratio leaves the range goes."""
    mask = [[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]]
    old = [[-1.0, -1.0, 0.0, -1.0, -1.0], [-0.5, -0.5, -0.5, 0.0, 0.0]]
    infer = [[-1.0, -1.1, 0.0, -1.6, -1.4], [-0.5, -0.45, -0.55, 0.0, 0.0]]
    batch = _batch(mask, [1.0, 0.0], traj_group_id=["g", "g"])
    batch.batch["old_log_probs"], batch.batch["rollout_log_probs"] = torch.tensor(old), torch.tensor(infer)
    rule = {"enabled": True, "agg_type": "segment", "ratio_low": 0.8, "ratio_high": 1.25}
    config = _config("traj", correction={"filters": [rule]})
    assert config.recompute_old_log_probs(1)
    metrics = compute_agentic_targets(batch, config)
    # turn means of old - infer: row 0: 0.05 (kept), 0.5 (exp 1.65: dropped); row 1: 0.0 (kept)
    assert batch.batch["response_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert metrics["actor/train_infer_masked_tokens"] == 2 and metrics["actor/train_infer_masked_sequences"] == 0


def test_equal_episode_weights_give_every_step_wise_episode_the_same_share_of_the_loss():
    # episode A has three turns, B one: unweighted, A's rows are 3/4 of the loss; weighted, each episode is half
    batch = _batch(
        [[1, 1], [1, 0], [1, 1], [1, 1]],
        [0.0, 0.0, 0.0, 1.0],
        traj_group_id=["g"] * 4,
        traj_id=["A", "A", "A", "B"],
        step=[0, 1, 2, 0],
        state_hash=["s0", "s1", "s2", "s0"],
        episode_scores=[0.0, 0.0, 0.0, 1.0],
    )
    config = _config(
        "step",
        adv_estimator="gigpo",
        policy_loss={"loss_agg_mode": "seq-mean-token-mean", "equal_episode_weights": True},
    )
    metrics = compute_agentic_targets(batch, config)
    weights = batch.batch["is_weights"]
    assert weights.shape == batch.batch["response_mask"].shape
    # rows / (episodes * the episode's rows): A's rows 4 / (2 * 3), B's row 4 / (2 * 1)
    assert torch.allclose(weights[:, 0], torch.tensor([2 / 3, 2 / 3, 2 / 3, 2.0]))
    assert metrics["advantage/episode_weight_max"] == pytest.approx(2.0)
    # on-policy, the actor's loss is minus the episode-mean of each episode's row-mean of token-mean advantages
    logits = torch.randn(4, 3, 5, requires_grad=True)
    scale = LossScale(num_tokens=int(batch.batch["response_mask"].sum()), num_seqs=len(batch))
    settings = AgenticActorSettings(loss_agg_mode="seq-mean-token-mean")
    loss, _ = agentic_actor_loss(settings, batch, logits, scale, on_policy=True)
    mask = batch.batch["response_mask"].float()
    row = (batch.batch["advantages"] * mask).sum(-1) / mask.sum(-1)
    assert loss.item() == pytest.approx(-(float(row[:3].mean()) + float(row[3])) / 2, abs=1e-6)
    # off (the default): no weights are written, every row weighs as loss_agg_mode says
    plain = _batch([[1]] * 2, [0.0, 1.0], traj_group_id=["g"] * 2, traj_id=["A", "B"], step=[0, 0],
                   state_hash=["s", "s"], episode_scores=[0.0, 1.0])  # fmt: skip
    compute_agentic_targets(plain, _config("step", adv_estimator="gigpo"))
    assert "is_weights" not in plain.batch.keys()


def test_whiten_rewards_whitens_the_token_rewards_before_the_estimator():
    # ROLL's agentic pipeline reads whiten_rewards (agentic_compute_advantage); a ROLL agentic file that set it failed
    # to load ("unknown key; did you mean 'whiten_advantages'?"). Identity normalization, batch grouping: each row's
    # episode score on its last response token, whitened over the 5 response tokens (unbiased std), then returns.
    mask = [[1, 1, 0], [1, 1, 1]]
    columns = {"traj_group_id": ["g0", "g1"]}
    config = _config("traj", whiten_rewards=True, reward_normalization={"grouping": "batch", "method": "identity"})
    batch = _batch(mask, [1.0, 3.0], **columns)
    compute_agentic_targets(batch, config)
    tokens = torch.tensor([0.0, 1.0, 0.0, 0.0, 3.0])  # the five response tokens' rewards, row by row
    white = (tokens - tokens.mean()) / torch.sqrt(tokens.var() + 1e-8)
    expected = torch.tensor([[white[0] + white[1], white[1], 0.0], [white[2:].sum(), white[3:].sum(), white[4]]])
    assert torch.allclose(batch.batch["advantages"], expected, atol=1e-5)
    plain = _batch(mask, [1.0, 3.0], **columns)
    compute_agentic_targets(plain, _config("traj", reward_normalization={"grouping": "batch", "method": "identity"}))
    assert plain.batch["advantages"].tolist() == [[1.0, 1.0, 0.0], [3.0, 3.0, 3.0]]


def test_whiten_rewards_is_refused_with_agentic_reinforce():
    with pytest.raises(ValueError, match="whiten_rewards.*agentic_reinforce"):
        _config("traj", adv_estimator="agentic_reinforce", whiten_rewards=True)
