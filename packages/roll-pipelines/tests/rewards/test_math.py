"""Math answer extraction and equivalence checking."""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest

from roll.pipelines.rewards import MathRewardWorker, answers_match, extract_answer, extract_boxed, math_score
from roll.pipelines.rewards import math as math_reward
from roll.runtime import ConfigError, DataProto, WorkerConfig


class RewardRoleConfig(WorkerConfig):
    reward_type: str = "math"
    reward_kwargs: dict = {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the result is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
        (r"first \boxed{1}, finally \boxed{ \{1, \{2\}\} }", r"\{1, \{2\}\}"),
        (r"\boxed{a^{b^{c}}} then an unclosed \boxed{3", "a^{b^{c}}"),
        (r"\fbox{7}", "7"),
        (r"$\boxed 5$", "5"),
        ("no box here", None),
    ],
)
def test_extract_boxed_takes_the_last_complete_box_with_nested_braces(text, expected):
    assert extract_boxed(text) == expected


def test_extract_answer_fallbacks():
    assert extract_answer(r"The answer is 3 but \boxed{4}") == "4"
    assert extract_answer("So the final answer is: $x+1$.") == "x+1"
    assert extract_answer("So the answer is 0.5.") == "0.5"
    assert extract_answer("We get 3 apples and 1,250 pears") == "1250"
    assert extract_answer("We get 3 apples and 12 pears", fallback="answer_phrase") is None
    assert extract_answer("The answer is 7", fallback="last_number") == "7"
    assert extract_answer("The answer is 7", fallback="none") is None
    with pytest.raises(ConfigError, match="fallback"):
        extract_answer("x", fallback="guess")


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("0.5", r"\frac{1}{2}"),
        ("1/2", "0.5"),
        (r"\dfrac{3}{4}", "0.75"),
        ("2", "2.0"),
        ("1,000", "1000"),
        (r"90^\circ", "90"),
        (r"\text{Yes}", "yes"),
    ],
)
def test_equivalent_answers_match(answer, truth):
    assert answers_match(answer, truth)


@pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="symbolic checks need math-verify")
@pytest.mark.parametrize(
    ("answer", "truth"),
    [("x+1", "1+x"), (r"\sqrt{2}/2", r"\frac{1}{\sqrt{2}}"), (r"\{1,2\}", r"\{2,1\}"), ("(1,2]", r"(1, 2]")],
)
def test_symbolically_equivalent_answers_match(answer, truth):
    assert answers_match(answer, truth)


@pytest.mark.parametrize(("answer", "truth"), [("12", "19"), ("[0,1]", "(0,1)"), ("x+2", "x+1"), ("0.51", "1/2")])
def test_different_answers_do_not_match(answer, truth):
    assert not answers_match(answer, truth)


def test_math_score_reasons_and_scores():
    assert math_score(r"... so \boxed{19}", "19") == (1.0, "correct")
    assert math_score(r"\boxed{12}", "19") == (0.0, "wrong answer: got 12, expected 19")
    assert math_score("I think it is 19", "19") == (1.0, "correct")  # fallback: last number
    assert math_score("I think it is 19", "19", require_boxed=True, format_score=-0.5) == (-0.5, "no \\boxed answer")
    assert math_score("no idea", "19") == (0.0, "no answer found")
    assert math_score(r"\boxed{19}", "") == (0.0, "missing ground_truth")
    assert math_score(r"\boxed{19}", r"\boxed{19}", correct_score=2.0) == (2.0, "correct")
    assert math_score(r"\boxed{18}", 19, wrong_score=-1.0)[0] == -1.0


def test_without_math_verify_numbers_and_strings_still_compare(monkeypatch):
    monkeypatch.setattr(math_reward, "_math_verify", lambda: None)
    assert answers_match("0.5", r"\frac{1}{2}")
    assert answers_match(r"\left( 1, 2 \right)", "(1,2)")
    assert not answers_match("x+1", "1+x")  # symbolic equivalence needs math-verify


@pytest.fixture
def without_math_verify(monkeypatch):
    """``import math_verify`` fails (as when it is not installed) for the duration of the test."""
    monkeypatch.setitem(sys.modules, "math_verify", None)  # None in sys.modules makes the import raise ImportError
    math_reward._math_verify.cache_clear()
    yield
    math_reward._math_verify.cache_clear()


def test_fallback_path_without_math_verify_scores_boxed_and_plain_answers(without_math_verify):
    assert math_reward._math_verify() is None
    assert math_score(r"\boxed{19}", r"\boxed{19}") == (1.0, "correct")
    assert math_score("so it is 19", r"\boxed{19}") == (1.0, "correct")
    assert math_score(r"\boxed{\frac{1}{2}}", r"\boxed{0.5}") == (1.0, "correct")
    assert math_score(r"\boxed{18}", r"\boxed{19}") == (0.0, r"wrong answer: got 18, expected \boxed{19}")
    assert answers_match(r"\boxed{x+1}", "x+1")
    assert not answers_match("x+1", "1+x")  # symbolic equivalence needs math-verify


def test_slow_symbolic_check_times_out(monkeypatch):
    monkeypatch.setattr(math_reward, "_symbolic_match", lambda a, b: time.sleep(5))
    assert math_score(r"\boxed{x^2}", "y", timeout_s=0.2) == (0.0, "verifier timeout after 0.2 s")


def _worker(**kwargs) -> MathRewardWorker:
    worker = MathRewardWorker(RewardRoleConfig(name="math_reward", reward_kwargs=kwargs))
    worker.initialize(None)
    return worker


def test_math_worker_scores_a_batch_locally():
    worker = _worker(correct_score=1.0, wrong_score=-1.0, require_boxed=True, num_workers=3)
    batch = DataProto.from_dict(
        non_tensors={
            "prompt": ["p"] * 4,
            "response_text": [r"\boxed{4}", r"\boxed{5}", "4", r"\boxed{\frac{1}{2}}"],
            "ground_truth": ["4", "4", "4", "0.5"],
            "tag": ["math"] * 4,
        }
    )
    out = worker.compute_rewards(batch)
    assert out["scores"].tolist() == [1.0, -1.0, 0.0, 1.0]
    assert out["reward_info"].tolist() == ["correct", "wrong answer: got 5, expected 4", "no \\boxed answer", "correct"]


def test_math_worker_rejects_bad_kwargs():
    with pytest.raises(ConfigError, match="unknown reward_kwargs"):
        _worker(correct=1.0)
    with pytest.raises(ConfigError, match="fallback"):
        _worker(fallback="nope")
    with pytest.raises(ConfigError, match="num_workers"):
        _worker(num_workers=0)
