"""IFEval-style instruction-following rewards (ROLL's ``GeneralRuleRewardWorker``).

Each row's ``ground_truth`` is a JSON object (or dict) naming one check, ``func_name``, and its arguments (``N``,
``quantifier``, ``keyword_list``, ...). Arguments the check does not take are ignored, so IFEval rows that carry every
field (most of them null) work as they are. The answer checked is the response after the last ``</think>`` with
chat end markers removed. The training reward is the check (1.0 pass, 0.0 fail or an unknown ``func_name``) plus a
repetition penalty on the whole response: ``max_penalty * (1 - distinct 3-grams / 3-grams)`` (``max_penalty`` -0.5;
0 turns it off), as ROLL adds it to its response-level reward.

The checks follow ROLL's, which follow open-instruct's ``if_functions``: word counts split on whitespace, sentences
end at ``.`` or ``?`` followed by whitespace, bullets are lines starting with ``*`` or ``-``, and so on (see each
check). One deliberate difference: ROLL's ``verify_keyword_frequency`` compares every word with itself and so counts
all words; here it counts the given word (case-insensitive, whole words), which is what the instruction asks.
``validate_response_language`` needs ``langdetect`` (``pip install 'roll-pipelines[ifeval]'``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from roll.pipelines.rewards.base import RewardWorker
from roll.runtime import ConfigError, MissingExtraError, import_extra

__all__ = [
    "IFEVAL_CHECKS",
    "IFEvalRewardWorker",
    "ifeval_answer",
    "ifeval_check",
    "repetition_penalty",
]

_CHAT_MARKERS = ("<|endoftext|>", "<pad>", "<|im_end|>")


def _strip_markers(text: str) -> str:
    for marker in _CHAT_MARKERS:
        text = text.replace(marker, "")
    return text


def ifeval_answer(response: str) -> str:
    """The part of a response the checks read: after the last ``</think>`` (leading newlines dropped)."""
    text = _strip_markers(response)
    cut = text.rfind("</think>")
    return text if cut < 0 else text[cut + len("</think>") :].lstrip("\n")


def _quantified(count: int, n: int, quantifier: str, around: int) -> bool:
    if quantifier == "at least":
        return count >= n
    if quantifier == "at most":
        return count <= n
    if quantifier == "around":
        return abs(count - n) <= around
    return False


# --- the checks (argument names are ROLL's ground_truth keys) --------------------------------------------------
def verify_keywords(text: str, keyword_list: list[str]) -> bool:
    """Every keyword appears (case-insensitive substring)."""
    lower = text.lower()
    return all(str(word).lower() in lower for word in keyword_list)


def verify_keyword_frequency(text: str, word: str, N: int) -> bool:
    """``word`` appears exactly N times as a whole word (case-insensitive)."""
    words = re.findall(r"\b\w+\b", text.lower())
    return words.count(str(word).lower()) == N


def validate_forbidden_words(text: str, forbidden_words: list[str]) -> bool:
    """No forbidden word appears (case-insensitive substring)."""
    lower = text.lower()
    return not any(str(word).lower() in lower for word in forbidden_words)


def verify_letter_frequency(text: str, letter: str, N: int) -> bool:
    """``letter`` (one character, case-sensitive) occurs exactly N times."""
    if len(letter) != 1:
        raise ValueError(f"letter must be one character, got {letter!r}")
    return text.count(letter) == N


def validate_response_language(text: str, language: str) -> bool:
    """langdetect's language code of the text equals ``language`` (e.g. 'en')."""
    langdetect = import_extra("langdetect", "the IFEval language check", "roll-pipelines", "ifeval")
    langdetect.DetectorFactory.seed = 0  # langdetect samples; a fixed seed makes the reward deterministic
    return bool(langdetect.detect(text) == language)


def verify_paragraph_count(text: str, N: int) -> bool:
    """N non-empty paragraphs separated by the markdown divider ``* * *``."""
    cleaned = "\n".join(line.strip() for line in text.splitlines()).strip()
    parts = cleaned.split("* * *")
    return all(part.strip() for part in parts) and len(parts) == N


def validate_word_constraint(text: str, N: int, quantifier: str) -> bool:
    """Whitespace-separated words: at least / at most / around (within max(round(N/10), 1)) N."""
    return _quantified(len(text.split()), N, quantifier, around=max(round(N * 0.1), 1))


def _sentence_count(text: str) -> int:
    """Sentences end at '.' or '?' followed by one whitespace character, unless the period closes an abbreviation
    written like 'e.g.' (word char, '.', word char, any) or 'Mr.' (capital, lowercase, '.'), as in ROLL."""
    count = 1
    for at in range(1, len(text)):
        if not text[at].isspace() or text[at - 1] not in ".?":
            continue
        dotted = at >= 4 and bool(re.fullmatch(r"\w\.\w.", text[at - 4 : at], flags=re.S))
        title = at >= 3 and bool(re.fullmatch(r"[A-Z][a-z]\.", text[at - 3 : at]))
        count += not (dotted or title)
    return count


def verify_sentence_constraint(text: str, N: int, quantifier: str) -> bool:
    """Sentences: at least / at most / around (within 1) N."""
    return _quantified(_sentence_count(text), N, quantifier, around=1)


def validate_paragraphs(text: str, N: int, first_word: str, i: int) -> bool:
    """N paragraphs split by blank lines ("\\n\\n"); paragraph i (1-based) starts with ``first_word``."""
    paragraphs = text.split("\n\n")
    return len(paragraphs) == N and paragraphs[i - 1].strip().startswith(first_word)


def verify_postscript(text: str, postscript_marker: str) -> bool:
    """The marker (e.g. 'P.S.') appears and something follows it."""
    at = text.find(postscript_marker)
    return at >= 0 and len(text[at:].strip()) > len(postscript_marker)


def validate_placeholders(text: str, N: int) -> bool:
    """At least N square-bracket placeholders like [address]."""
    return len(re.findall(r"\[(.*?)\]", text)) >= N


def verify_bullet_points(text: str, N: int) -> bool:
    """Exactly N lines starting (after indentation) with '*' or '-'."""
    return sum(1 for line in text.split("\n") if line.strip().startswith(("*", "-"))) == N


def validate_title(text: str) -> bool:
    """A title in double angular brackets, <<like this>>."""
    return re.search(r"<<(.*?)>>", text) is not None


def validate_choice(text: str, options: list[str]) -> bool:
    """The answer is (contained in) one of the options."""
    return any(text in str(option) for option in options)


def validate_highlighted_sections(text: str, N: int) -> bool:
    """At least N markdown highlights, *like this*."""
    return len(re.findall(r"\*(.*?)\*", text)) >= N


def validate_sections(text: str, N: int, section_splitter: str) -> bool:
    """N sections, each starting with ``section_splitter`` (text before the first one counts unless empty)."""
    sections = text.split(section_splitter)
    if sections[0] == "":
        sections = sections[1:]
    return len(sections) == N


def validate_json_format(text: str) -> bool:
    """The whole answer parses as JSON."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def validate_repeat_prompt(text: str, original_prompt: str) -> bool:
    """The answer starts with the request repeated word for word."""
    return text.startswith(original_prompt)


def validate_two_responses(text: str) -> bool:
    """Two different answers separated by exactly one '******'."""
    if text.count("******") != 1:
        return False
    first, second = (part.strip() for part in text.split("******"))
    return first != second


def validate_uppercase(text: str) -> bool:
    """No lowercase letters."""
    return text == text.upper()


def validate_lowercase(text: str) -> bool:
    """No uppercase letters."""
    return text == text.lower()


def validate_frequency_capital_words(text: str, N: int, quantifier: str) -> bool:
    """All-capital words (\\b[A-Z]+\\b): at least / at most / around (exactly, as ROLL) N."""
    return _quantified(len(re.findall(r"\b[A-Z]+\b", text)), N, quantifier, around=0)


def validate_end(text: str, end_phrase: str) -> bool:
    """The answer ends with ``end_phrase`` exactly."""
    return text.endswith(end_phrase)


def validate_quotation(text: str) -> bool:
    """The whole answer is wrapped in double quotes."""
    return text.startswith('"') and text.endswith('"')


def validate_no_commas(text: str) -> bool:
    """No comma anywhere."""
    return "," not in text


# ROLL's func_name -> (check, its argument names)
IFEVAL_CHECKS: dict[str, tuple[Callable[..., bool], tuple[str, ...]]] = {
    "verify_keywords": (verify_keywords, ("keyword_list",)),
    "verify_keyword_frequency": (verify_keyword_frequency, ("word", "N")),
    "validate_forbidden_words": (validate_forbidden_words, ("forbidden_words",)),
    "verify_letter_frequency": (verify_letter_frequency, ("letter", "N")),
    "validate_response_language": (validate_response_language, ("language",)),
    "verify_paragraph_count": (verify_paragraph_count, ("N",)),
    "validate_word_constraint": (validate_word_constraint, ("N", "quantifier")),
    "verify_sentence_constraint": (verify_sentence_constraint, ("N", "quantifier")),
    "validate_paragraphs": (validate_paragraphs, ("N", "first_word", "i")),
    "verify_postscript": (verify_postscript, ("postscript_marker",)),
    "validate_placeholders": (validate_placeholders, ("N",)),
    "verify_bullet_points": (verify_bullet_points, ("N",)),
    "validate_title": (validate_title, ()),
    "validate_choice": (validate_choice, ("options",)),
    "validate_highlighted_sections": (validate_highlighted_sections, ("N",)),
    "validate_sections": (validate_sections, ("N", "section_splitter")),
    "validate_json_format": (validate_json_format, ()),
    "validate_repeat_prompt": (validate_repeat_prompt, ("original_prompt",)),
    "validate_two_responses": (validate_two_responses, ()),
    "validate_uppercase": (validate_uppercase, ()),
    "validate_lowercase": (validate_lowercase, ()),
    "validate_frequency_capital_words": (validate_frequency_capital_words, ("N", "quantifier")),
    "validate_end": (validate_end, ("end_phrase",)),
    "validate_quotation": (validate_quotation, ()),
    "validate_no_commas": (validate_no_commas, ()),
}


def ifeval_check(answer: str, ground_truth: Any) -> tuple[bool, str]:
    """(passed, reason) of the check ``ground_truth`` names (a JSON string or a dict with ``func_name``)."""
    spec = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth or {})
    name = spec.get("func_name")
    if name not in IFEVAL_CHECKS:
        return False, f"unknown or missing func_name {name!r}"
    check, params = IFEVAL_CHECKS[name]
    args = {key: spec[key] for key in params if key in spec}
    missing = [key for key in params if key not in args]
    if missing:
        return False, f"{name}: ground_truth lacks {missing}"
    try:
        passed = bool(check(answer, **args))
    except MissingExtraError:
        raise
    except Exception as e:  # a malformed argument fails the check, as in ROLL
        return False, f"{name} raised {type(e).__name__}: {e}"
    return passed, f"{name}={'pass' if passed else 'fail'}"


def repetition_penalty(text: str, ngram_size: int = 3, max_penalty: float = -0.5) -> float:
    """``max_penalty * (1 - distinct/total)`` over the lowercase word n-grams; 0 for texts shorter than n words."""
    words = text.lower().split()
    if len(words) < ngram_size:
        return 0.0
    grams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    return (1.0 - len(set(grams)) / len(grams)) * max_penalty


class IFEvalRewardWorker(RewardWorker):
    """IFEval instruction checks; reward_kwargs ``repetition_penalty`` (<= 0, default -0.5) and ``ngram_size`` (3)."""

    required_fields = (("ground_truth",),)
    default_kwargs = {"repetition_penalty": -0.5, "ngram_size": 3}

    def setup(self, kwargs: dict[str, Any]) -> None:
        penalty, size = kwargs["repetition_penalty"], kwargs["ngram_size"]
        if not isinstance(penalty, int | float) or penalty > 0:
            raise ConfigError(f"reward_kwargs.repetition_penalty must be a number <= 0, got {penalty!r}")
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"reward_kwargs.ngram_size must be a positive integer, got {size!r}")
        self.penalty, self.ngram_size = float(penalty), size

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        response = row.get("response_text") or ""
        passed, reason = ifeval_check(ifeval_answer(response), row.get("ground_truth"))
        penalty = repetition_penalty(_strip_markers(response), self.ngram_size, self.penalty) if self.penalty else 0.0
        return (1.0 if passed else 0.0) + penalty, f"{reason} repetition={penalty:.4f}"
