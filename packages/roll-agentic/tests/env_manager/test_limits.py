"""Turn, token and context limits, truncated responses, and policy aborts."""

from __future__ import annotations

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env_manager import turn_seed
from roll.agentic.policy import GenerateResult
from roll.runtime import ConfigError

SPEC = dict(env_type="frozen_lake", env_config={"size": 4}, max_steps=3)
BLOCKED = "<answer>Jump</answer>"  # a valid answer format but no action: the player never moves


def test_max_steps_ends_the_episode(play, scripted) -> None:
    (result,) = play(CustomEnvConfig(**SPEC), scripted([BLOCKED] * 5))
    assert (result.end_reason, result.num_turns) == ("max_steps", 3)
    assert result.batch.non_tensor_batch["end_reason"].tolist() == ["max_steps"]


def test_per_step_token_cap_reaches_the_request(play, scripted) -> None:
    client = scripted([BLOCKED] * 3)
    play(CustomEnvConfig(**SPEC, max_tokens_per_step=7), client, max_new_tokens=64)
    assert [r.generation_config.max_new_tokens for r in client.requests] == [7, 7, 7]
    assert all(r.generation_config.num_return_sequences == 1 for r in client.requests)


def test_each_turn_is_seeded_from_its_episodes_sampling_seed_and_the_turn(play, scripted) -> None:
    def seeds(sampling_seed: int | None, **gen) -> list[int | None]:
        client = scripted([BLOCKED] * 6)
        play(CustomEnvConfig(**SPEC), client, episodes=2, sampling_seed=sampling_seed, **gen)
        return [r.seed for r in client.requests]

    first = seeds(5)
    assert first == [turn_seed(5 + episode, turn, None) for episode in range(2) for turn in range(3)]
    assert len(set(first)) == 6 and seeds(5) == first
    assert seeds(5, seed=9) == first  # the scheduler mixes the run's seed into sampling_seed; the env seed adds nothing
    assert turn_seed(5, 0, 9) not in first  # generating_args.seed, when set, takes part
    assert seeds(None) == [None] * 6  # a task without a sampling seed: the engine's own generator


def test_truncated_response_is_closed_by_the_template(play, scripted, tokenizer) -> None:
    client = scripted(["<answer>Up</answer> " + "and then more words " * 10] * 3)
    (result,) = play(CustomEnvConfig(**SPEC, max_tokens_per_step=5), client)
    assert result.batch.non_tensor_batch["finish_reason"].tolist() == ["length"]
    second_prompt = client.requests[1].prompt_ids
    first_response_end = len(client.requests[0].prompt_ids) + 5
    # No EOS was sampled, so the turn is closed with the template's own end-of-turn text before the next message.
    assert tokenizer.decode(second_prompt[first_response_end:]).startswith("<|im_end|>\n<|im_start|>user")


def test_trajectory_token_budget(play, scripted) -> None:
    client = scripted([BLOCKED] * 10)
    (result,) = play(CustomEnvConfig(**{**SPEC, "max_steps": 10}, max_tokens_per_traj=20), client)
    per_turn = result.metrics["generated_tokens"] / result.num_turns
    assert result.end_reason == "token_limit" and result.metrics["generated_tokens"] <= 20
    assert result.num_turns == -(-20 // int(per_turn)) or result.metrics["generated_tokens"] == 20
    assert int(result.batch.batch["response_mask"].sum()) == result.metrics["generated_tokens"]


def test_context_limit_keeps_rows_within_sequence_length(play, scripted) -> None:
    client = scripted([BLOCKED] * 10)
    (unbounded,) = play(CustomEnvConfig(**{**SPEC, "max_steps": 10}), client)
    length = int(unbounded.batch.batch["attention_mask"].sum())
    limit = length // 2
    (result,) = play(CustomEnvConfig(**{**SPEC, "max_steps": 10}), scripted([BLOCKED] * 10), sequence_length=limit)
    assert result.end_reason == "context_limit" and 0 < result.num_turns < 10
    assert int(result.batch.batch["attention_mask"].sum()) <= limit
    assert unbounded.end_reason == "max_steps"


def test_first_prompt_longer_than_the_context_is_a_config_error(play, scripted) -> None:
    """Every episode of the tag would end before its first turn and train on nothing: said at once, not run."""
    with pytest.raises(ConfigError, match=r"env tag 'T'.*rollout\.sequence_length=16.*raise it"):
        play(CustomEnvConfig(**SPEC), scripted([BLOCKED]), sequence_length=16)


class AbortingClient:
    async def generate(self, request):
        return GenerateResult(request.request_id, [], None, "abort", 0)


def test_aborted_request_ends_the_episode_without_samples(play) -> None:
    (result,) = play(CustomEnvConfig(**SPEC), AbortingClient())
    assert (result.end_reason, result.batch, result.faulted) == ("aborted", None, False)
