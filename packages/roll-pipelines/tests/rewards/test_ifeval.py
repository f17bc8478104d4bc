"""IFEval instruction checks (ROLL's GeneralRuleRewardWorker): each check on passing and failing answers, the
answer extraction, the repetition penalty against a hand count, and the worker's reward = check + penalty."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from roll.pipelines.rewards import REWARDS
from roll.pipelines.rewards.choice import GeneralValRewardWorker
from roll.pipelines.rewards.ifeval import (
    IFEVAL_CHECKS,
    IFEvalRewardWorker,
    ifeval_answer,
    ifeval_check,
    repetition_penalty,
)
from roll.runtime import ConfigError, DataProto, WorkerConfig

# (func_name, arguments, an answer that passes, one that fails)
CASES = [
    ("verify_keywords", {"keyword_list": ["Apple", "pie"]}, "I like apple PIE.", "I like apples."),
    ("verify_keyword_frequency", {"word": "cat", "N": 2}, "Cat and cat, not cats.", "cat cat cat"),
    ("validate_forbidden_words", {"forbidden_words": ["bad"]}, "all good", "a BAD day"),
    ("verify_letter_frequency", {"letter": "a", "N": 3}, "Banana", "A banana a"),
    ("verify_paragraph_count", {"N": 2}, "one\n* * *\ntwo", "one\n* * *\n\n* * *\nthree"),
    ("validate_word_constraint", {"N": 10, "quantifier": "around"}, " ".join(["w"] * 11), " ".join(["w"] * 12)),
    ("validate_word_constraint", {"N": 3, "quantifier": "at least"}, "a b c", "a b"),
    ("validate_word_constraint", {"N": 3, "quantifier": "at most"}, "a b c", "a b c d"),
    ("verify_sentence_constraint", {"N": 3, "quantifier": "at least"}, "One. Two? Three.", "One. Two."),
    # 'e.g.' and 'Mr.' do not end sentences: one sentence, so "at most 1" passes
    ("verify_sentence_constraint", {"N": 1, "quantifier": "at most"}, "See e.g. this Mr. Smith", "A. B."),
    ("validate_paragraphs", {"N": 2, "first_word": "Then", "i": 2}, "First.\n\nThen more.", "First.\n\nAnd more."),
    ("verify_postscript", {"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi.\nP.S."),
    ("validate_placeholders", {"N": 2}, "at [address] on [date]", "at [address]"),
    ("verify_bullet_points", {"N": 2}, "* one\n  - two\ntext", "* one\ntext"),
    ("validate_title", {}, "<<My Poem>>\nroses", "My Poem\nroses"),
    ("validate_choice", {"options": ["My answer is yes.", "My answer is no."]}, "My answer is no.", "maybe"),
    ("validate_highlighted_sections", {"N": 2}, "*one* and *two*", "*one* only"),
    ("validate_sections", {"N": 2, "section_splitter": "SECTION"}, "SECTION 1 a SECTION 2 b", "SECTION 1 a"),
    ("validate_json_format", {}, '{"a": [1, 2]}', "{a: 1}"),
    ("validate_repeat_prompt", {"original_prompt": "Say hi."}, "Say hi. Hi!", "Hi! Say hi."),
    ("validate_two_responses", {}, "yes ****** no", "yes ****** yes"),
    ("validate_uppercase", {}, "ALL CAPS 1", "Not caps"),
    ("validate_lowercase", {}, "all lower 1", "Not lower"),
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "at least"}, "THE BIG dog", "THE dog"),
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "around"}, "THE BIG dog", "THE BIG RED dog"),
    ("validate_end", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", "Any other questions? Ok"),
    ("validate_quotation", {}, '"quoted"', '"half'),
    ("validate_no_commas", {}, "no commas here", "one, two"),
]


@pytest.mark.parametrize(("name", "args", "good", "bad"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_check_passes_and_fails(name: str, args: dict, good: str, bad: str) -> None:
    assert ifeval_check(good, {"func_name": name, **args})[0] is True
    assert ifeval_check(bad, json.dumps({"func_name": name, **args}))[0] is False


def test_every_roll_check_is_covered() -> None:
    covered = {case[0] for case in CASES} | {"validate_response_language"}
    assert covered == set(IFEVAL_CHECKS)


def test_language_check() -> None:
    pytest.importorskip("langdetect")
    text = "This is clearly an English sentence about the weather and the garden today."
    assert ifeval_check(text, {"func_name": "validate_response_language", "language": "en"})[0] is True
    assert ifeval_check(text, {"func_name": "validate_response_language", "language": "de"})[0] is False


def test_extra_null_fields_are_ignored_and_bad_specs_fail() -> None:
    spec = {"func_name": "validate_title", "N": None, "quantifier": None, "keyword_list": None}
    assert ifeval_check("<<t>>", spec) == (True, "validate_title=pass")
    assert ifeval_check("x", {"func_name": "no_such_check"})[0] is False
    passed, reason = ifeval_check("x", {"func_name": "verify_bullet_points"})
    assert not passed and "lacks ['N']" in reason
    passed, reason = ifeval_check("x", {"func_name": "verify_bullet_points", "N": None})  # None == 1: no error
    assert not passed
    passed, reason = ifeval_check("ab", {"func_name": "verify_letter_frequency", "letter": "ab", "N": 1})
    assert not passed and "ValueError" in reason


def test_answer_is_after_the_last_think_without_chat_markers() -> None:
    assert ifeval_answer("<think>a</think>x</think>\n\nANSWER<|im_end|>") == "ANSWER"
    assert ifeval_answer("plain<|endoftext|>") == "plain"


def _reference_penalty(text: str, n: int, max_penalty: float) -> float:
    words = text.lower().split()
    if len(words) < n:
        return 0.0
    seen: list[tuple[str, ...]] = []
    total = 0
    for i in range(len(words) - n + 1):
        total += 1
        gram = tuple(words[i : i + n])
        if gram not in seen:
            seen.append(gram)
    return max_penalty * (total - len(seen)) / total


@pytest.mark.parametrize(
    "text", ["", "a b", "a b c", "A b c a B c a b c", "the cat sat on the mat the cat sat on the mat again"]
)
def test_repetition_penalty_matches_a_hand_count(text: str) -> None:
    assert repetition_penalty(text, 3, -0.5) == pytest.approx(_reference_penalty(text, 3, -0.5), abs=1e-9)
    assert repetition_penalty("a b c a b c a b c", 3, -0.5) == pytest.approx(-0.5 * (1 - 3 / 7))


class RewardRoleConfig(WorkerConfig):
    reward_type: str = "ifeval"
    reward_kwargs: dict = {}


def _worker(cls: type, **kwargs: object) -> Any:
    worker = cls(RewardRoleConfig(name="reward", reward_kwargs=kwargs))
    worker.initialize(None)
    return worker


def test_worker_reward_is_check_plus_repetition_penalty() -> None:
    assert REWARDS.get("ifeval") is IFEvalRewardWorker and REWARDS.get("general_val") is GeneralValRewardWorker
    worker = _worker(IFEvalRewardWorker)
    truth = json.dumps({"func_name": "validate_lowercase"})
    response = "<think>I Think</think>\nok ok ok ok ok"  # the check reads the answer, the penalty the whole text
    score, reason = worker.score_row({"response_text": response, "ground_truth": truth})
    expected = 1.0 + _reference_penalty("<think>I Think</think>\nok ok ok ok ok", 3, -0.5)
    assert score == pytest.approx(expected, abs=1e-9) and "validate_lowercase=pass" in reason
    off = _worker(IFEvalRewardWorker, repetition_penalty=0)
    assert off.score_row({"response_text": "OK OK OK OK", "ground_truth": truth})[0] == 0.0
    with pytest.raises(ConfigError, match="repetition_penalty"):
        _worker(IFEvalRewardWorker, repetition_penalty=0.5)


def test_general_val_scores_the_choice_boxed_or_not() -> None:
    worker = _worker(GeneralValRewardWorker)
    assert worker.score_row({"response_text": "so \\boxed{B}", "ground_truth": "B"})[0] == 1.0
    assert worker.score_row({"response_text": "the answer is B", "ground_truth": "B"})[0] == 1.0
    assert worker.score_row({"response_text": "\\boxed{C}", "ground_truth": "B"})[0] == 0.0


def test_worker_scores_a_batch() -> None:
    worker = _worker(IFEvalRewardWorker)
    truths = [json.dumps({"func_name": "validate_no_commas"}), json.dumps({"func_name": "validate_title"})]
    batch = DataProto.from_dict(
        non_tensors={"response_text": np.array(["a, b", "<<T>>"], dtype=object), "ground_truth": np.array(truths)}
    )
    out = worker.compute_rewards(batch)
    assert out.batch["scores"].tolist() == [0.0, 1.0]
