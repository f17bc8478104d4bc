"""The agentic estimators applied to real rollout batches, as the pipeline will wire them (step-wise GiGPO and
trajectory-wise agentic_reinforce)."""

from __future__ import annotations

import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig, RewardNormalizationConfig
from roll.agentic.policy import MockPolicyClient, RandomActionPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.pipelines.algorithms import (
    agentic_reinforce_advantages,
    gigpo_rewards,
    grouped_reward_norm,
    labels_to_index,
    reinforce_returns,
    state_group_index,
    step_discounted_returns,
    token_level_rewards_from_scores,
)
from roll.strategies import GenerationConfig


def _rollout(tokenizer, manager: str):
    envs = {"FL": CustomEnvConfig(env_type="frozen_lake", env_config={"format_penalty": -0.1}, max_steps=5,
                                  env_manager_cls=manager)}  # fmt: skip
    config = EnvManagerConfig(num_env_groups=3, group_size=4, tags=["FL"])
    client = MockPolicyClient(tokenizer, RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.3))
    scheduler = RolloutScheduler.local(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=24), sequence_length=4096
    )
    try:
        return scheduler.get_batch(12).batch
    finally:
        scheduler.close()


def test_gigpo_on_step_wise_rows(tokenizer) -> None:
    batch = _rollout(tokenizer, "step")
    columns = batch.non_tensor_batch
    traj = labels_to_index(columns["traj_id"].tolist())
    groups = labels_to_index(columns["traj_group_id"].tolist())
    step_returns = step_discounted_returns(
        torch.tensor(columns["step_scores"], dtype=torch.float32), traj, torch.tensor(columns["step"]), gamma=0.95
    )
    # The first row of each trajectory carries the discounted sum of all its step rewards.
    for t in set(traj.tolist()):
        rows = (traj == t).nonzero().flatten()
        rewards = [float(columns["step_scores"][i]) for i in rows]
        assert abs(step_returns[rows[0]].item() - sum(r * 0.95**k for k, r in enumerate(rewards))) < 1e-5
    norm = RewardNormalizationConfig(grouping="traj_group_id", method="mean_std")
    out = gigpo_rewards(
        torch.tensor(columns["episode_scores"], dtype=torch.float32),
        step_returns,
        groups,
        state_group_index(groups, labels_to_index(columns["state_hash"].tolist())),
        episode_reward_weight=1.0,
        step_reward_weight=1.0,
        episode_norm=(norm.norm_mean_type, norm.norm_std_type),
    )
    token_rewards = token_level_rewards_from_scores(out.rewards, batch.batch["response_mask"])
    advantages, _ = reinforce_returns(token_rewards, batch.batch["response_mask"], gamma=1.0)
    mask = batch.batch["response_mask"].bool()
    assert advantages.shape == mask.shape and bool((advantages[~mask] == 0).all())
    assert torch.allclose(advantages[:, 0], out.rewards)  # gamma 1: every token of a row gets its row's reward


def test_agentic_reinforce_on_trajectory_rows(tokenizer) -> None:
    batch = _rollout(tokenizer, "traj")
    mask = batch.batch["response_mask"]
    groups = labels_to_index(batch.non_tensor_batch["traj_group_id"].tolist())
    scores = grouped_reward_norm(batch.batch["scores"], groups, "group", "group")
    token_rewards = token_level_rewards_from_scores(scores, mask)
    advantages, _ = agentic_reinforce_advantages(token_rewards, mask, gamma=0.5)
    for row in range(len(batch)):
        turns = int(batch.non_tensor_batch["num_turns"][row])
        valid = mask[row].bool()
        values = advantages[row][valid]
        # Turn k of n gets 0.5 ** (n - 1 - k) times the row's normalised score.
        distinct = sorted({round(v, 6) for v in values.tolist()}, key=abs)
        expected = sorted({round(scores[row].item() * 0.5 ** (turns - 1 - k), 6) for k in range(turns)}, key=abs)
        assert distinct == expected
