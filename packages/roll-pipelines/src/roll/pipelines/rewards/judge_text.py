"""roll's own judge style as text in, text out: the prompt template and its rendering, and reading a score out of
the judge's answer (see :mod:`roll.pipelines.rewards.llm_judge` for the settings that choose them)."""

from __future__ import annotations

import math
import re
import string
from typing import Any

from roll.pipelines.rewards.base import ScoredRow
from roll.pipelines.rewards.math import extract_boxed
from roll.runtime import ConfigError

__all__ = [
    "DEFAULT_JUDGE_TEMPLATE",
    "PLACEHOLDERS",
    "check_judge_template",
    "format_judge_prompt",
    "judge_verdict",
    "parse_judge_score",
]

DEFAULT_JUDGE_TEMPLATE = (
    "You are a strict and fair grader. Judge how correct and helpful the response is as an answer to the "
    "question, on a scale from {min_score} (wrong or useless) to {max_score} (fully correct and helpful).\n\n"
    "[Question]\n{prompt}\n\n"
    "[Reference answer]\n{reference}\n\n"
    "[Response]\n{response}\n\n"
    'Give a one-sentence justification, then end with a line "Score: N" where N is a number from {min_score} '
    "to {max_score}."
)
PLACEHOLDERS = ("prompt", "response", "reference", "max_score", "min_score")

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# "Score: 7", "**Score**: 7", "Rating = [[8]]", "final score is 6.5": the keyword, optional filler, the number.
_KEYWORD_SCORE = re.compile(
    rf"(?:score|rating|grade)\s*(?:\*\*|__)?\s*(?:is|of|:|=)?\s*(?:\*\*|__)?\s*[\[(]*\s*({_NUMBER})", re.IGNORECASE
)
_FRACTION = re.compile(rf"({_NUMBER})\s*/\s*({_NUMBER})")
_FULL_NUMBER = re.compile(rf"\s*({_NUMBER})\s*")


def _number_text(value: float) -> str:
    """``10.0`` -> ``"10"``, ``2.5`` -> ``"2.5"`` (how the scale appears in prompts and reasons)."""
    return f"{value:g}"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def _found_number(text: str, max_score: float, pattern: re.Pattern[str] | str | None) -> float | None:
    """The number the judge gave (see :func:`parse_judge_score`), whether or not it is on the scale."""
    if pattern is not None:
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        matches = list(compiled.finditer(text))
        if not matches:
            return None
        last = matches[-1]
        if "score" in compiled.groupindex:
            return _as_float(last.group("score"))
        return _as_float(last.group(1) if compiled.groups else last.group(0))
    keyword = _KEYWORD_SCORE.findall(text)
    if keyword:
        return _as_float(keyword[-1])
    boxed = extract_boxed(text)
    if boxed is not None:
        return _as_float(boxed)
    fractions = [num for num, den in _FRACTION.findall(text) if _same(den, max_score)]
    return _as_float(fractions[-1]) if fractions else None


def parse_judge_score(
    text: str, *, max_score: float = 10.0, min_score: float = 0.0, pattern: re.Pattern[str] | str | None = None
) -> float | None:
    """The judge's raw score in ``text`` (on its own scale), or None when none is found or it is off the scale.

    With ``pattern``: its last match; the number is the group named ``score``, else the first group, else the
    whole match. Without: the last "Score/Rating/Grade: N", else the last ``\\boxed{N}``, else the last
    ``N/<max_score>`` fraction.
    """
    value = _found_number(text, max_score, pattern)
    return value if value is not None and min_score <= value <= max_score else None


def _same(text: str, value: float) -> bool:
    number = _as_float(text)
    return number is not None and math.isclose(number, value)


def _as_float(raw: str | None) -> float | None:
    if raw is None:
        return None
    match = _FULL_NUMBER.fullmatch(raw)
    if match is None:
        return None
    value = float(match.group(1))
    return value if math.isfinite(value) else None


def judge_verdict(
    output: str,
    *,
    max_score: float = 10.0,
    min_score: float = 0.0,
    pattern: re.Pattern[str] | str | None = None,
    unparseable_score: float = 0.0,
    finish_reason: str | None = None,
    reason_chars: int = 120,
) -> ScoredRow:
    """Score one judge answer: ``((v - min) / (max - min), "judge v/max: <answer>")`` or the unparseable case."""
    quoted = f": {_clip(output, reason_chars)}" if reason_chars > 0 else ""
    value = _found_number(output, max_score, pattern)
    if value is not None and not min_score <= value <= max_score:
        scale = f"[{_number_text(min_score)}, {_number_text(max_score)}]"
        return float(unparseable_score), f"unparseable judge output: {_number_text(value)} is outside {scale}{quoted}"
    if value is None:
        cut = " (cut at max_new_tokens)" if finish_reason == "length" else ""
        if not output.strip():
            return float(unparseable_score), f"unparseable judge output: empty answer{cut}"
        return float(unparseable_score), f"unparseable judge output{cut}{quoted}"
    normalized = (value - min_score) / (max_score - min_score)
    return normalized, f"judge {_number_text(value)}/{_number_text(max_score)}{quoted}"


def _template_fields(template: str) -> set[str]:
    """Placeholder names of a ``str.format`` template; ConfigError if it is not a valid template."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise ConfigError(
            f"reward_kwargs.prompt_template is not a valid template ({e}); write literal braces as '{{{{' and '}}}}'"
        ) from None


def check_judge_template(template: Any) -> None:
    """ConfigError unless ``template`` is a non-empty ``str.format`` template of known placeholders with
    ``{response}`` among them (``reward_kwargs.prompt_template``)."""
    if not isinstance(template, str) or not template.strip():
        raise ConfigError("reward_kwargs.prompt_template must be a non-empty string")
    fields = _template_fields(template)
    unknown = sorted(fields - set(PLACEHOLDERS))
    if unknown:
        raise ConfigError(
            f"reward_kwargs.prompt_template uses unknown placeholders {unknown}; the known ones are "
            f"{list(PLACEHOLDERS)} (write literal braces as '{{{{' and '}}}}')"
        )
    if "response" not in fields:
        raise ConfigError("reward_kwargs.prompt_template must contain {response}, or the judge never sees it")


def format_judge_prompt(
    template: str,
    row: dict[str, Any],
    *,
    reference_key: str | None = "ground_truth",
    no_reference_text: str = "(none given)",
    max_score: float = 10.0,
    min_score: float = 0.0,
) -> str:
    """The judge prompt of one row (non-tensor columns ``prompt``, ``response_text``, the reference column)."""
    reference = row.get(reference_key) if reference_key else None
    values = {
        "prompt": str(row.get("prompt") or ""),
        "response": str(row.get("response_text") or ""),
        "reference": no_reference_text if reference is None or str(reference).strip() == "" else str(reference),
        "max_score": _number_text(max_score),
        "min_score": _number_text(min_score),
    }
    return template.format_map(values)
