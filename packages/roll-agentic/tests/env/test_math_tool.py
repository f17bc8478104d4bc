"""The arithmetic env: seeded questions, exact answers, format penalty, and the tool_math wrapper."""

from __future__ import annotations

import random

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env import ArithmeticEnv, make_env
from roll.agentic.env.base import layout_split
from roll.agentic.tools import ToolEnvWrapper, format_tool_call
from roll.runtime import ConfigError


def test_questions_are_seeded_and_answers_exact() -> None:
    env = ArithmeticEnv(digits=2, num_operands=3, operators="+*")
    question, info = env.reset(seed=4)
    assert question == ArithmeticEnv(digits=2, num_operands=3, operators="+*").reset(seed=4)[0]
    a, op1, b, op2, c = question.removeprefix("What is ").removesuffix("?").split()
    values = {"+": lambda x, y: x + y, "*": lambda x, y: x * y}
    expected = (
        values[op1](int(a), values[op2](int(b), int(c)))
        if op2 == "*"
        else values[op2](values[op1](int(a), int(b)), int(c))
    )
    assert info["answer"] == expected
    _observation, reward, terminated, _truncated, info = env.step(f"<answer>{expected}</answer>")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_wrong_answer_and_format_penalty() -> None:
    env = ArithmeticEnv(format_penalty=-0.05, max_steps=2)
    _, info = env.reset(seed=1)
    _, reward, terminated, truncated, step_info = env.step("I think it is big")
    assert (reward, terminated, truncated, step_info["action_is_valid"]) == (-0.05, False, False, False)
    _observation, reward, terminated, truncated, step_info = env.step(f"<answer>{info['answer'] + 1}</answer>")
    assert (reward, terminated, step_info["success"]) == (0.0, True, False)


def test_tool_math_env_runs_python_in_the_sandbox() -> None:
    env = make_env("tool_math", digits=3, operators="*")
    assert isinstance(env, ToolEnvWrapper)
    question, info = env.reset(seed=9)
    assert "python_code" in question and "<tool_call>" in question
    expression = question.splitlines()[0].removeprefix("What is ").removesuffix("?")
    observation, _reward, terminated, _truncated, step_info = env.step(
        format_tool_call("python_code", {"code": f"print({expression})"})
    )
    assert not terminated and step_info["use_tool"] is True
    assert observation.strip().endswith(str(info["answer"]))
    assert step_info["metrics"] == {"tool_use_counter": 1, "tool_success_counter": 1}
    *_, terminated, _, step_info = env.step(f"<answer>{info['answer']}</answer>")
    assert terminated and step_info["success"] and step_info["metrics"]["tool_use_counter"] == 1


def test_a_split_the_settings_leave_empty_is_a_config_error_not_a_hang() -> None:
    """One-digit sums have 100 questions and none of them hashes into a 1% validation split: reset used to draw
    forever; it stops after MAX_SPLIT_DRAWS draws and names the settings."""
    assert {layout_split(f"{a} + {b}", 0.01) for a in range(10) for b in range(10)} == {"train"}
    env = ArithmeticEnv(digits=1, operators="+", split="val", val_fraction=0.01)
    with pytest.raises(
        ConfigError, match=r"arithmetic digits=1 num_operands=2 operators='\+': no layout of split='val'"
    ):
        env.reset(0)
    question, _ = ArithmeticEnv(digits=1, operators="+", split="train", val_fraction=0.01).reset(0)
    assert question.startswith("What is")


def test_tool_math_names_a_misspelled_key_before_building() -> None:
    # make_tool_math_env takes **env_config for ArithmeticEnv: without its signature a typo passed roll validate
    from roll.agentic.env import check_env
    from roll.agentic.pool import check_env_spec

    with pytest.raises(ConfigError, match=r"'digts'.*accepted keys: \['tool_configs', 'wrapper_args', 'digits'"):
        check_env("tool_math", {"digts": 3})
    bad_tool = CustomEnvConfig(env_type="tool_math", env_config={"tool_configs": [{"tool_id": "pyhton_code"}]})
    with pytest.raises(ConfigError, match=r"custom_envs\.Math: unknown tool 'pyhton_code'"):
        check_env_spec("Math", bad_tool)
    good = CustomEnvConfig(env_type="tool_math", env_config={"digits": 2, "tool_configs": [{"tool_id": "python_code"}]})
    assert check_env_spec("Math", good) == "Math: env_type 'tool_math' (make_tool_math_env), tools ['python_code']"


def test_random_answers_follow_the_seed_and_leave_the_global_random_alone() -> None:
    random.seed(1)
    state = random.getstate()
    env = ArithmeticEnv(digits=2)
    draws = [env.sample_random_action(seed=s) for s in range(20)]
    env.sample_random_action()
    assert random.getstate() == state  # code that seeded the process-global random draws as it would have
    assert draws == [ArithmeticEnv(digits=2).sample_random_action(seed=s) for s in range(20)]
    numbers = [int(d.removeprefix("<answer>").removesuffix("</answer>")) for d in draws]
    assert len(set(numbers)) > 10 and all(-100 <= n <= 10_000 for n in numbers)
