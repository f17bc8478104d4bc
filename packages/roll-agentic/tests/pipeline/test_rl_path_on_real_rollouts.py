"""The agentic RL path end to end on batches played by the real env managers (issue 14's learning audit).

FrozenLake episodes are played by a noisy planner (so groups have mixed outcomes), laid out by the trajectory-wise
or step-wise env manager, turned into training targets by :func:`compute_agentic_targets` with the recipes'
settings, and checked against references computed here in plain Python from the batch's own columns:

* trajectory-wise GRPO: the advantage sits on the assistant tokens only (the loss mask), equals the episode score
  normalised within its ``traj_group_id`` (mean, unbiased std + 1e-6), and has the sign of (score - group mean);
  the episode score is the sum of the turn rewards and sits on the row's last assistant token;
* step-wise GiGPO: episode part + step part against a hand-computed reference at 1e-6;
* the actor loss (:func:`agentic_actor_loss`, on-policy PPO-clip, token-mean) on a tiny Qwen2 equals a
  plain-PyTorch ``-mean(A * log p)`` reference in value and gradient (1e-6), and one small step along that gradient
  raises the mean log-prob of positive-advantage trajectories' assistant tokens and lowers that of negative ones;
  one small Adam step raises the advantage-weighted log-likelihood.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import pytest
import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.pipeline import AgenticConfig
from roll.agentic.pipeline.advantage import compute_agentic_targets
from roll.agentic.pipeline.workers import AgenticActorSettings, agentic_actor_loss
from roll.agentic.policy import MockPolicyClient
from roll.agentic.policy.expert import FrozenLakeExpert
from roll.agentic.scheduler import RolloutScheduler
from roll.protocol import DataProto
from roll.strategies import GenerationConfig, LossScale
from roll.strategies.ops import log_probs_from_logits, response_logits

ROLE = {"model_name_or_path": "/models/tiny"}
GROUPS, GROUP_SIZE = 6, 4


def _lake(manager: str) -> CustomEnvConfig:
    return CustomEnvConfig(
        env_type="frozen_lake",
        env_config={"size": 4, "p": 0.8, "is_slippery": False, "format_penalty": -0.1},
        max_steps=6,
        max_tokens_per_step=16,
        env_manager_cls=manager,
        **({"history_length": 0} if manager == "step" else {}),
    )


def _play(tokenizer, manager: str, seed: int = 3) -> DataProto:
    envs = {"Lake": _lake(manager)}
    config = EnvManagerConfig(num_env_groups=GROUPS, group_size=GROUP_SIZE, tags=["Lake"])
    client = MockPolicyClient(tokenizer, FrozenLakeExpert(noise=0.5), seed=seed)
    scheduler = RolloutScheduler.local(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16), sequence_length=2048
    )
    try:
        batch = scheduler.get_batch(GROUPS * GROUP_SIZE).batch
    finally:
        scheduler.close()
    assert batch is not None
    return batch


def _config(manager: str, **extra) -> AgenticConfig:
    return AgenticConfig.model_validate(
        {
            "actor_train": {"model_args": ROLE},
            "actor_infer": {"model_args": ROLE},
            "custom_envs": {"Lake": {"env_type": "frozen_lake", "env_manager_cls": manager}},
            "train_env_manager": {"num_env_groups": GROUPS, "group_size": GROUP_SIZE, "tags": ["Lake"]},
            "rollout_batch_size": GROUPS * GROUP_SIZE,
            **extra,
        }
    )


def _normalized(values: list[float], groups: list[object], std: bool = True) -> list[float]:
    """ROLL's group normalisation in plain Python: mean/std (unbiased std; singletons and no spread give 0), or the
    mean only (``std=False``)."""
    members: dict[object, list[float]] = defaultdict(list)
    for value, group in zip(values, groups):
        members[group].append(value)
    out = []
    for value, group in zip(values, groups):
        vals = members[group]
        if not std:
            out.append(value - statistics.fmean(vals))
            continue
        spread = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out.append((value - statistics.fmean(vals)) / (spread + 1e-6) if len(vals) > 1 and spread > 1e-6 else 0.0)
    return out


@pytest.fixture(scope="module")
def traj_batch(tokenizer) -> DataProto:
    return _play(tokenizer, "traj")


def test_traj_rows_mask_assistant_tokens_and_carry_the_episode_score(tokenizer, traj_batch, mask_runs) -> None:
    data, columns = traj_batch.batch, traj_batch.non_tensor_batch
    outcomes = [bool(s) for s in columns["success"]]
    assert 0 < sum(outcomes) < len(outcomes)  # the noisy planner gives mixed outcomes
    for row in range(len(traj_batch)):
        mask = data["response_mask"][row]
        segments = mask_runs(mask.tolist())
        assert len(segments) == int(columns["num_turns"][row])  # one loss segment per assistant turn
        for start, end in segments:  # each segment is the policy's answer, nothing of the environment's
            text = tokenizer.decode(data["responses"][row, start:end].tolist(), skip_special_tokens=True)
            assert "<answer>" in text and "Turn" not in text and "_" not in text
        if len(segments) > 1:  # environment messages between turns: attended, never trained on
            gap = data["responses"][row, segments[0][1] : segments[1][0]].tolist()
            assert "Turn 2" in tokenizer.decode(gap, skip_special_tokens=True)
        step_scores = [float(v) for v in columns["step_scores"][row]]
        assert float(data["scores"][row]) == pytest.approx(sum(step_scores))
        assert float(columns["episode_scores"][row]) == pytest.approx(sum(step_scores))
        assert (float(data["scores"][row]) >= 1.0) == outcomes[row]  # success scores 1 (minus format penalties)


def test_traj_grpo_advantage_is_the_group_normalized_score_on_the_loss_mask(traj_batch) -> None:
    batch = traj_batch.select_idxs(list(range(len(traj_batch))))
    metrics = compute_agentic_targets(batch, _config("traj"))
    data, columns = batch.batch, batch.non_tensor_batch
    scores = [float(v) for v in data["scores"]]
    groups = list(columns["traj_group_id"])
    expected = _normalized(scores, groups)
    means = {g: statistics.fmean([s for s, h in zip(scores, groups) if h == g]) for g in set(groups)}
    mixed = 0
    for row in range(len(batch)):
        mask = data["response_mask"][row].bool()
        adv = data["advantages"][row]
        assert torch.allclose(adv[mask], torch.full_like(adv[mask], expected[row]), atol=1e-6)
        assert bool((adv[~mask] == 0).all())  # env tokens and padding carry no advantage
        sign = math.copysign(1, scores[row] - means[groups[row]]) if abs(scores[row] - means[groups[row]]) > 1e-9 else 0
        assert (expected[row] > 0) - (expected[row] < 0) == sign
        mixed += sign != 0
        # the normalised episode score sits on the last assistant token of the row, nowhere else
        last = int(mask.nonzero().max())
        rewards = data["token_level_rewards"][row]
        assert float(rewards[last]) == pytest.approx(expected[row], abs=1e-6)
        assert float(rewards.abs().sum() - rewards[last].abs()) == pytest.approx(0.0, abs=1e-6)
    assert mixed > 0 and metrics["advantage/zero_rows"] == pytest.approx(1 - mixed / len(batch))


@pytest.fixture(scope="module")
def step_batch(tokenizer) -> DataProto:
    return _play(tokenizer, "step")


@pytest.mark.parametrize("method", [None, "mean_std", "mean"])
def test_step_gigpo_matches_a_hand_computed_reference(step_batch, method) -> None:
    # None: the default (mean/std within traj_group_id, as GRPO); otherwise reward_normalization.method over
    # traj_group_id for the episode part and over the state groups for the step part, as ROLL does
    batch = step_batch.select_idxs(list(range(len(step_batch))))
    gamma, w_episode, w_step = 0.95, 1.0, 0.5
    norm = {} if method is None else {"reward_normalization": {"grouping": "traj_group_id", "method": method}}
    config = _config(
        "step", adv_estimator="gigpo", step_reward_gamma=gamma, episode_reward_weight=w_episode,
        step_reward_weight=w_step, **norm,
    )  # fmt: skip
    compute_agentic_targets(batch, config)
    columns = batch.non_tensor_batch
    n = len(batch)
    traj, step = list(columns["traj_id"]), [int(v) for v in columns["step"]]
    rewards = [float(v) for v in columns["step_scores"]]
    returns = [0.0] * n  # discounted return-to-go within each episode, by step number
    for t in set(traj):
        rows = sorted((i for i in range(n) if traj[i] == t), key=lambda i: step[i])
        running = 0.0
        for i in reversed(rows):
            running = rewards[i] + gamma * running
            returns[i] = running
    groups = list(columns["traj_group_id"])
    with_std = method != "mean"
    episode = _normalized([float(v) for v in columns["episode_scores"]], groups, with_std)
    step_part = _normalized(returns, [(g, h) for g, h in zip(groups, columns["state_hash"])], with_std)
    expected = torch.tensor([w_episode * e + w_step * s for e, s in zip(episode, step_part)])
    assert any(abs(s) > 0 for s in step_part)  # some states were seen by two episodes with different returns
    mask = batch.batch["response_mask"].bool()
    adv = batch.batch["advantages"]
    for row in range(n):
        assert torch.allclose(adv[row][mask[row]], expected[row].expand(int(mask[row].sum())), atol=1e-6)
        assert bool((adv[row][~mask[row]] == 0).all())


def _tiny_policy(vocab: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _response_log_probs(model: torch.nn.Module, batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    data = batch.batch
    logits = model(
        input_ids=data["input_ids"], attention_mask=data["attention_mask"], position_ids=data["position_ids"]
    ).logits
    return logits, log_probs_from_logits(response_logits(logits, data["responses"].shape[1]), data["responses"])


def _mean_by_sign(log_probs: torch.Tensor, batch: DataProto) -> tuple[float, float]:
    mask = batch.batch["response_mask"].float()
    sign = batch.batch["advantages"].sum(-1).sign()
    per_row = (log_probs * mask).sum(-1) / mask.sum(-1)
    return float(per_row[sign > 0].mean()), float(per_row[sign < 0].mean())


def _actor_loss_on(traj_batch: DataProto, vocab: int) -> tuple[DataProto, torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A copy of the batch with GRPO targets, a fresh tiny policy, its response log-probs and roll's actor loss."""
    batch = traj_batch.select_idxs(list(range(len(traj_batch))))
    compute_agentic_targets(batch, _config("traj"))
    model = _tiny_policy(vocab)
    mask = batch.batch["response_mask"]
    scale = LossScale(num_tokens=int(mask.sum()), num_seqs=len(batch))
    logits, log_probs = _response_log_probs(model, batch)
    loss, _ = agentic_actor_loss(AgenticActorSettings(), batch, logits, scale, on_policy=True)
    return batch, model, log_probs, loss


def _weighted_log_likelihood(batch: DataProto, log_probs: torch.Tensor) -> float:
    """The objective the loss descends: token-mean of advantage x log-prob over the loss mask."""
    mask = batch.batch["response_mask"]
    return float((batch.batch["advantages"] * log_probs.detach() * mask).sum() / mask.sum())


def test_actor_loss_matches_plain_pytorch_and_one_adam_step_moves_log_probs_by_advantage_sign(
    tokenizer, traj_batch
) -> None:
    batch, model, log_probs, loss = _actor_loss_on(traj_batch, len(tokenizer))
    mask = batch.batch["response_mask"]
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    # plain reference: on-policy PPO-clip is -A * exp(logp - logp.detach()), token-mean over the loss mask
    ratio = torch.exp(log_probs - log_probs.detach())
    reference = -(batch.batch["advantages"] * ratio * mask).sum() / mask.sum()
    ref_grads = torch.autograd.grad(reference, list(model.parameters()))
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
    for got, want in zip(grads, ref_grads):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)

    # one plain gradient step with roll's gradient (SGD: its direction exactly, no per-parameter rescaling)
    before_pos, before_neg = _mean_by_sign(log_probs.detach(), batch)
    objective = _weighted_log_likelihood(batch, log_probs)
    with torch.no_grad():
        for param, grad in zip(model.parameters(), grads):
            param -= 0.1 * grad
        after = _response_log_probs(model, batch)[1]
    after_pos, after_neg = _mean_by_sign(after, batch)
    assert after_pos > before_pos  # positive-advantage trajectories' assistant tokens became more likely
    assert after_neg < before_neg  # negative ones less likely
    assert _weighted_log_likelihood(batch, after) > objective


def test_one_small_adam_step_raises_the_advantage_weighted_log_likelihood(tokenizer, traj_batch) -> None:
    """Adam's first step is about lr x sign(gradient) per parameter: it raises sum(A x log p), but on a batch whose
    negative rows hold 3x the positive rows' tokens it may lower both signs' means (docs/results/agentic.md)."""
    batch, model, log_probs, loss = _actor_loss_on(traj_batch, len(tokenizer))
    objective = _weighted_log_likelihood(batch, log_probs)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    with torch.no_grad():
        after = _response_log_probs(model, batch)[1]
    assert _weighted_log_likelihood(batch, after) > objective
