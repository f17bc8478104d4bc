"""Per-request generation (roll.strategies.requests) on the mock backend: segments, resume, finish reasons."""

from __future__ import annotations

import pytest

from roll.strategies import GenerationConfig, StrategyArgs, StrategyWorker, StrategyWorkerConfig
from roll.strategies.requests import GenerateRequest, generate_requests

EOS = 1


def make_strategy():
    config = StrategyWorkerConfig(
        name="mock", strategy_args=StrategyArgs(strategy_name="mock_infer", strategy_config={"vocab_size": 50})
    )
    worker = StrategyWorker(config)
    worker.initialize()
    return worker.strategy


def test_samples_of_one_prompt_are_generated_together_and_stamped() -> None:
    strategy = make_strategy()
    config = GenerationConfig(max_new_tokens=6)
    requests = [GenerateRequest(f"g/{j}", [5, 6], config, seed=3) for j in range(2)]
    requests.append(GenerateRequest("h/0", [7, 8, 9], config))
    results = generate_requests(strategy, requests, pad_token_id=0, policy_version=4)
    assert [r.request_id for r in results] == ["g/0", "g/1", "h/0"]
    assert {r.policy_version for r in results} == {4}
    # The mock answers sample j of a prompt with sum s with 1 + (s + j) % budget tokens (+ EOS if it fits).
    assert [len(r.token_ids) for r in results] == [6, 2, 2]
    assert [r.finish_reason for r in results] == ["length", "stop", "stop"]
    assert all(len(r.log_probs or []) == len(r.token_ids) for r in results)


def test_a_segment_that_ends_early_is_an_abort_and_resumes_from_its_prefix() -> None:
    strategy = make_strategy()
    request = GenerateRequest("g/0", [5, 6], GenerationConfig(max_new_tokens=6), segment_tokens=2, seed=10)
    first = generate_requests(strategy, [request], pad_token_id=0)[0]
    assert first.finish_reason == "abort" and len(first.token_ids) == 2  # the segment's budget, not the request's
    resumed = request.resumed(first)
    assert resumed.prefix_ids == first.token_ids and resumed.prefix_log_probs == first.log_probs
    assert resumed.budget_left == 4 and resumed.seed == 11
    tokens = list(first.token_ids)
    while True:
        result = generate_requests(strategy, [resumed], pad_token_id=0)[0]
        tokens += result.token_ids
        if result.finish_reason != "abort":
            break
        resumed = resumed.resumed(result)
    assert len(tokens) <= 6
    assert result.finish_reason in ("stop", "length")
    assert result.finish_reason == "stop" or len(tokens) == 6


def test_a_request_without_budget_is_rejected() -> None:
    strategy = make_strategy()
    spent = GenerateRequest("g/0", [5], GenerationConfig(max_new_tokens=2), prefix_ids=[3, 4])
    with pytest.raises(ValueError, match="no budget left"):
        generate_requests(strategy, [spent], pad_token_id=0)
