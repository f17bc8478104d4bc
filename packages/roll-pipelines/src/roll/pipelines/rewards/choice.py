"""Multiple-choice rewards scored like ROLL's rule workers: the letter in the last ``\\boxed{}``.

The answer is the text after the last ``</think>``. Its choice is the first capital letter of the last
``\\boxed{...}`` (the format is then correct) or, without a box, of the text after the last "answer is" (or of the
whole answer). It is correct when it equals the first character of ``ground_truth``.

* ``multiple_choice``: 1.0 when boxed and correct, else 0.0.
* ``crossthinkqa``: by ``mode`` (ROLL's ``reward_type``) for (correct, boxed) = (yes, yes) / (yes, no) / (no, yes)
  / (no, no): ``loose`` 1, 1, -1, -1; ``soft`` 1, 0.5, -0.5, -1; ``strict`` 1, -1, -1, -1.
* ``general_val`` (ROLL's ``GeneralValRuleRewardWorker``, a validation scorer for single-choice benchmarks such as
  ceval, race_high, mmlu_pro, commonsense_qa): 1.0 when the choice is correct, boxed or not, else 0.0. ROLL trains
  on a zero reward for this domain (its response-level reward is all zeros; the score is only logged); roll's
  score is the reward, so use it for validation domains.
"""

from __future__ import annotations

import re
from typing import Any

from roll.pipelines.rewards.base import RewardWorker
from roll.runtime import ConfigError

__all__ = [
    "CrossThinkQARewardWorker",
    "GeneralValRewardWorker",
    "MultipleChoiceRewardWorker",
    "choice_answer",
    "crossthinkqa_score",
]

_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
_MODES: dict[str, tuple[float, float, float, float]] = {
    "loose": (1.0, 1.0, -1.0, -1.0),
    "soft": (1.0, 0.5, -0.5, -1.0),
    "strict": (1.0, -1.0, -1.0, -1.0),
}


def choice_answer(response: str) -> tuple[str | None, bool]:
    """(chosen capital letter or None, whether it came from a ``\\boxed{}``) of a response."""
    answer = response.rsplit("</think>", 1)[-1].lstrip("\n") if "</think>" in response else response
    boxes = _BOXED.findall(answer)
    if boxes:
        text, boxed = boxes[-1], True
    else:
        cut = answer.lower().rfind("answer is")
        text, boxed = (answer if cut < 0 else answer[cut + len("answer is") :]), False
    letter = next((ch for ch in text if ch.isupper()), None)
    return letter, boxed


def _correct(letter: str | None, ground_truth: Any) -> bool:
    truth = str(ground_truth or "")
    return letter is not None and bool(truth) and letter == truth[0]


def crossthinkqa_score(response: str, ground_truth: Any, mode: str = "soft") -> tuple[float, str]:
    letter, boxed = choice_answer(response)
    correct = _correct(letter, ground_truth)
    both, correct_only, boxed_only, neither = _MODES[mode]
    score = both if correct and boxed else correct_only if correct else boxed_only if boxed else neither
    return score, f"choice={letter} boxed={boxed} correct={correct}"


class MultipleChoiceRewardWorker(RewardWorker):
    """1.0 when the boxed choice letter equals ``ground_truth``'s first character, else 0.0."""

    required_fields = (("ground_truth",),)

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        letter, boxed = choice_answer(row.get("response_text") or "")
        correct = _correct(letter, row.get("ground_truth"))
        return (1.0 if correct and boxed else 0.0), f"choice={letter} boxed={boxed} correct={correct}"


class CrossThinkQARewardWorker(RewardWorker):
    """CrossThinkQA rule reward; reward_kwargs ``mode``: loose, soft (default) or strict."""

    required_fields = (("ground_truth",),)
    default_kwargs = {"mode": "soft"}

    def setup(self, kwargs: dict[str, Any]) -> None:
        if kwargs["mode"] not in _MODES:
            raise ConfigError(f"reward_kwargs.mode must be one of {sorted(_MODES)}, got {kwargs['mode']!r}")
        self.mode = kwargs["mode"]

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        return crossthinkqa_score(row.get("response_text") or "", row.get("ground_truth"), self.mode)


class GeneralValRewardWorker(RewardWorker):
    """Single-choice validation: 1.0 when the chosen letter equals ``ground_truth``'s first character, else 0.0."""

    required_fields = (("ground_truth",),)

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        letter, boxed = choice_answer(row.get("response_text") or "")
        correct = _correct(letter, row.get("ground_truth"))
        return (1.0 if correct else 0.0), f"choice={letter} boxed={boxed} correct={correct}"
