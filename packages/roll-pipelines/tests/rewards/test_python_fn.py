"""User-supplied Python reward functions: loading by dotted path, calling conventions and return validation."""

from __future__ import annotations

import pytest

from roll.pipelines.rewards import (
    PythonFunctionRewardWorker,
    call_reward_function,
    exact_match,
    length_penalty,
    load_reward_function,
)
from roll.runtime import ConfigError, DataProto, WorkerConfig

ROW = {"prompt": "2+2?", "response_text": " 4 ", "ground_truth": "4", "tag": "math", "response_length": 3}


class RewardRoleConfig(WorkerConfig):
    reward_type: str = "python"
    reward_kwargs: dict = {}


def test_load_reward_function_resolves_dotted_paths():
    assert load_reward_function("roll.pipelines.rewards.python_fn:exact_match") is exact_match
    assert load_reward_function("roll.pipelines.rewards.python_fn.length_penalty") is length_penalty


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (None, "must be a 'package.module:function' string"),
        ("", "must be a 'package.module:function' string"),
        ("no_such_package_xyz.mod:fn", "cannot be imported"),
        ("roll.pipelines.rewards.python_fn:no_such_fn", "cannot be imported"),
        ("justaname", "cannot be imported"),
        ("math:pi", "not a callable"),
    ],
)
def test_load_reward_function_rejects_bad_targets(target, message):
    with pytest.raises(ConfigError, match=message):
        load_reward_function(target)


def test_example_functions():
    assert call_reward_function(exact_match, ROW) == (1.0, "correct")
    assert call_reward_function(exact_match, {**ROW, "ground_truth": "5"}) == (0.0, "no exact match")
    assert call_reward_function(length_penalty, ROW) == (0.0, "within length")
    assert call_reward_function(length_penalty, {**ROW, "response_text": "x" * 15}, {"max_chars": 10}) == (
        -0.5,
        "5 characters over 10",
    )


def test_functions_get_only_the_fields_they_name():
    def score(prompt, response, tag):
        return float(tag == "math"), f"{prompt}|{response.strip()}"

    assert call_reward_function(score, ROW) == (1.0, "2+2?|4")


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (0.5, (0.5, "")),
        (2, (2.0, "")),
        (True, (1.0, "")),
        ((0.25, "close"), (0.25, "close")),
        ("high", (0.0, "reward function returned str 'high', expected a float or (float, str)")),
        (None, (0.0, "reward function returned NoneType None, expected a float or (float, str)")),
        (("x", "y"), (0.0, "reward function returned tuple ('x', 'y'), expected a float or (float, str)")),
        (float("nan"), (0.0, "reward function returned a non-finite score nan")),
    ],
)
def test_return_values_are_validated(returned, expected):
    assert call_reward_function(lambda **_: returned, ROW) == expected


def test_python_worker_scores_rows_and_reports_errors_per_row():
    config = RewardRoleConfig(reward_kwargs={"function": "roll.pipelines.rewards.python_fn:exact_match"})
    worker = PythonFunctionRewardWorker(config)
    worker.initialize(None)
    batch = DataProto.from_dict(
        non_tensors={
            "prompt": ["a", "b", "c"],
            "response_text": ["4", "5", "6"],
            "ground_truth": ["4", "4", None],
            "tag": ["t"] * 3,
        }
    )
    out = worker.compute_rewards(batch)
    assert out["scores"].dtype.is_floating_point and out["scores"].tolist() == [1.0, 0.0, 0.0]
    assert out["reward_info"].tolist() == ["correct", "no exact match", "missing ground_truth"]

    worker.function = lambda **kwargs: 1 / 0 if kwargs["prompt"] == "b" else 1.0
    out = worker.compute_rewards(batch)
    assert out["scores"].tolist() == [1.0, 0.0, 1.0]
    assert out["reward_info"].tolist()[1] == "scoring error: ZeroDivisionError: division by zero"


def test_python_worker_config_errors():
    for kwargs, message in [
        ({}, "must be a 'package.module:function' string"),
        ({"function": "math:pi"}, "not a callable"),
        ({"function": "math:sqrt", "function_kwargs": {"prompt": 1}}, "may not set"),
    ]:
        with pytest.raises(ConfigError, match=message):
            PythonFunctionRewardWorker(RewardRoleConfig(reward_kwargs=kwargs)).initialize(None)
