"""Step-wise samples: one row per turn, a bounded history window, and state hashes for GiGPO."""

from __future__ import annotations

import hashlib

import torch

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env import FrozenLakeEnv
from roll.agentic.env_manager import StepEnvManager

SPEC = dict(env_type="frozen_lake", env_config={"size": 4}, max_steps=6, env_manager_cls="step", history_length=2)


def test_one_row_per_turn_with_steps_rewards_and_hashes(play, scripted, tokenizer) -> None:
    env = FrozenLakeEnv(size=4)
    env.reset(seed=5)
    plan = env.solution()
    responses = ["<answer>Jump</answer>", "<answer>Jump</answer>"] + [f"<answer>{a}</answer>" for a in plan]
    (result,) = play(CustomEnvConfig(**{**SPEC, "max_steps": 12}), scripted(responses), seed=5)
    batch = result.batch
    n = result.num_turns
    assert n == 2 + len(plan) and len(batch) == n and result.success
    columns = batch.non_tensor_batch
    assert columns["step"].tolist() == list(range(n))
    assert set(columns["traj_id"].tolist()) == {result.task.traj_id}
    # Every row's loss covers exactly its response; the prompt is not trained on.
    data = batch.batch
    for i, response in enumerate(responses[:n]):
        row_mask = data["response_mask"][i].bool()
        assert tokenizer.decode(data["responses"][i][row_mask]) == response + tokenizer.eos_token
    assert data["scores"].tolist() == columns["step_scores"].tolist() == [0.0] * (n - 1) + [1.0]
    assert columns["episode_scores"].tolist() == [1.0] * n
    # The two invalid moves leave the state unchanged: the first three rows saw the same observation.
    env.reset(seed=5)
    start = env.render()
    expected = hashlib.sha256(start.encode()).hexdigest()[:16]
    assert columns["state_hash"].tolist()[:3] == [expected] * 3
    assert len(set(columns["state_hash"].tolist())) == n - 2


def test_history_window_shows_the_last_turns_only(play, scripted, tokenizer) -> None:
    responses = [f"<answer>Jump{i}</answer>" for i in range(6)]
    client = scripted(responses)
    play(CustomEnvConfig(**SPEC), client, seed=1)
    prompts = [tokenizer.decode(r.prompt_ids) for r in client.requests]
    assert "(step:" not in prompts[0] and "completed 0 steps" in prompts[0]
    last = prompts[5]
    assert "Jump2" not in last and "Jump3" in last and "Jump4" in last and "(step: 4," in last
    assert "not valid" in last  # invalid actions are flagged in the history
    assert len({len(r.prompt_ids) for r in client.requests[2:]}) <= 2  # a fixed window: prompts stop growing


def test_rows_pad_into_one_batch(play, scripted) -> None:
    (result,) = play(CustomEnvConfig(**SPEC), scripted(["<answer>Up</answer>", "<answer>Left turn</answer>"] * 3))
    data = result.batch.batch
    widths = data["response_mask"].sum(-1).tolist()
    assert len(set(widths)) == 2  # two response lengths, right-padded to one width
    assert torch.equal(data["input_ids"][:, data["prompts"].shape[1] :], data["responses"])


def test_step_concat_shows_past_observations_without_actions(play, scripted, tokenizer) -> None:
    """ROLL's StepConcatEnvManager (gem examples): history = the previous history_length - 1 observations."""
    spec = {
        **SPEC,
        "env_manager_cls": "roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager",
        "history_length": 3,
        "agent_template": "Observation:\n{history}\n{current_observation}\nAct.",
    }
    config = CustomEnvConfig(**spec)
    assert config.env_manager_cls == "step_concat"
    client = scripted([f"<answer>Jump{i}</answer>" for i in range(6)])
    (result,) = play(config, client, seed=1)
    prompts = [tokenizer.decode(r.prompt_ids) for r in client.requests]
    assert len(result.batch) == result.num_turns == 6  # step-wise rows
    assert all("Jump" not in p for p in prompts)  # actions are never shown
    env = FrozenLakeEnv(size=4)
    env.reset(seed=1)
    grid = env.render()
    assert prompts[0].count(grid) == 1 and prompts[1].count(grid) == 2  # invalid moves: the same observation
    assert prompts[5].count(grid) == 3  # two past observations + the current one: a window of history_length


def test_messages_are_kept_only_for_a_client_that_sends_them(play, scripted, kept_messages) -> None:
    responses = ["<answer>Jump</answer>", "<answer>Up</answer>"]
    spec = CustomEnvConfig(**{**SPEC, "max_steps": 2})
    sizes = kept_messages(StepEnvManager)
    chat = scripted(responses, wants_messages=True)
    (with_messages,) = play(spec, chat, seed=5)
    chat_sizes, sizes[:] = list(sizes), []
    tokens = scripted(responses)
    (without,) = play(spec, tokens, seed=5)
    assert chat_sizes == [2, 2] and [len(r.messages) for r in chat.requests] == [2, 2]
    assert sizes == [0, 0] and all(r.messages is None for r in tokens.requests)
    for key in with_messages.batch.batch.keys():
        assert torch.equal(with_messages.batch.batch[key], without.batch.batch[key]), key
