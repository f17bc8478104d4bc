"""Rule-based math reward: extract the final answer of a response and check it against the ground truth.

Answer extraction (:func:`extract_answer`): the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces
nested to any depth. Without one, a fallback applies (``fallback=``):

* ``"none"``: no answer;
* ``"answer_phrase"``: the text after the last "answer is" / "answer:" / "answer =" (up to the end of the sentence);
* ``"last_number"``: the last number in the text (``-3``, ``1,000``, ``2.5``, ``3/4``);
* ``"answer_phrase_or_last_number"`` (default): the phrase, else the last number.

Comparison (:func:`answers_match`): equal after normalisation (spacing, ``\\left``/``\\right``, ``\\dfrac``,
``\\text{}``, degrees/percent signs, trailing period), else numerically equal (relative tolerance 1e-6), else
symbolically equivalent according to math-verify (``1/2`` = ``0.5`` = ``\\frac{1}{2}``, ``x+1`` = ``1+x``, sets,
intervals), run on a helper thread with a timeout. Without math-verify installed only the first two apply.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from collections.abc import Callable
from typing import Any

from roll.pipelines.rewards.base import RewardWorker
from roll.runtime import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["FALLBACKS", "MathRewardWorker", "answers_match", "extract_answer", "extract_boxed", "math_score"]

FALLBACKS = ("none", "answer_phrase", "last_number", "answer_phrase_or_last_number")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(.+?)(?:\.\s|\.$|\n|$)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_SIMPLE_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}$")


def _braced(text: str, start: int) -> str | None:
    """The content of the brace group opening at ``text[start]``, or None if it never closes."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}``/``\\fbox{...}`` (``\\boxed 5`` too), or None."""
    starts = sorted((m.start(), m.end()) for cmd in _BOX_COMMANDS for m in re.finditer(re.escape(cmd), text))
    for _, end in reversed(starts):
        rest = text[end:]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            content = _braced(text, end + len(rest) - len(stripped))
            if content is not None:
                return content.strip()
        elif rest[:1] == " " and stripped:
            return re.split(r"[\s$]", stripped, maxsplit=1)[0]
    return None


def extract_answer(text: str, fallback: str = "answer_phrase_or_last_number") -> str | None:
    """The final answer in ``text``: the last boxed expression, else per ``fallback`` (see module docstring)."""
    if fallback not in FALLBACKS:
        raise ConfigError(f"math answer fallback must be one of {FALLBACKS}, got {fallback!r}")
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    if fallback in ("answer_phrase", "answer_phrase_or_last_number"):
        matches = _ANSWER_PHRASE.findall(text)
        if matches:
            return matches[-1].strip().strip("$").strip()
    if fallback in ("last_number", "answer_phrase_or_last_number"):
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1].replace(",", "")
    return None


def normalize_answer(answer: str) -> str:
    """A canonical spelling of ``answer`` for string comparison."""
    text = answer.strip().strip("$").strip()
    if text.startswith("\\(") and text.endswith("\\)"):
        text = text[2:-2]
    text = _TEXT_WRAPPER.sub(r"\1", text)
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", "")):
        text = text.replace(old, new)
    for noise in ("^{\\circ}", "^\\circ", "\\%", "%", "\\!", "\\,", "\\;", "\\ ", "°"):
        text = text.replace(noise, "")
    text = re.sub(r"\s+", "", text).rstrip(".")
    return text.lower()


def _as_number(text: str) -> float | None:
    """``text`` (already normalised) as a number: ``-3``, ``1,000``, ``2.5``, ``3/4``, ``\\frac{3}{4}``."""
    frac = _SIMPLE_FRAC.match(text)
    if frac:
        sign, num, den = frac.groups()
        text = f"{sign}{num}/{den}"
    text = text.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text) else text
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


@functools.lru_cache(maxsize=1)
def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        logger.info("math-verify is not installed; math answers are compared as strings and numbers only")
        return None

    # We disable math-verify's signal-based timeouts (they only work on the main thread) and time out ourselves.
    class _DropTimeoutWarning(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "Timeout is disabled" not in record.getMessage()

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
    return parse, verify


@functools.cache
def _math_verify_loaded() -> None:
    """Import math-verify and what its first parse needs (sympy, the LaTeX grammar) outside any timeout."""
    mv = _math_verify()
    if mv is not None:
        mv[0]("$1$", parsing_timeout=None)


def _run_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """``fn()`` on a daemon thread; TimeoutError if it takes longer (the thread is abandoned, not killed)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as e:
            box["error"] = e

    thread = threading.Thread(target=target, name="math-verify", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"verifier timeout after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _symbolic_match(answer: str, ground_truth: str) -> bool | None:
    """math-verify's verdict, or None when it is not installed or cannot parse one of the two."""
    mv = _math_verify()
    if mv is None:
        return None
    parse, verify = mv
    gold = parse(ground_truth if "\\boxed" in ground_truth else f"${ground_truth}$", parsing_timeout=None)
    pred = parse(f"${answer}$", parsing_timeout=None)
    if not gold or not pred:
        return None
    return bool(verify(gold, pred, timeout_seconds=None))


def _unboxed(text: str) -> str:
    """The content of the last box in ``text`` if it has one, else ``text``."""
    boxed = extract_boxed(text)
    return text if boxed is None else boxed


def answers_match(answer: str, ground_truth: str, timeout_s: float = 5.0) -> bool:
    """Whether ``answer`` equals ``ground_truth`` (see module docstring). Raises TimeoutError if the symbolic
    check takes longer than ``timeout_s``.

    A ``\\boxed{...}`` around either side (ground truths are often stored boxed) is looked through, so the string and
    number checks compare the boxed contents as math-verify does."""
    norm_answer = normalize_answer(_unboxed(answer))
    norm_truth = normalize_answer(_unboxed(ground_truth))
    if norm_answer == norm_truth:
        return True
    num_answer, num_truth = _as_number(norm_answer), _as_number(norm_truth)
    if num_answer is not None and num_truth is not None:
        return math.isclose(num_answer, num_truth, rel_tol=1e-6, abs_tol=1e-9)
    # Imported (once, slowly: sympy) before the clock starts, so the timeout bounds only the check itself.
    _math_verify_loaded()
    verdict = _run_with_timeout(lambda: _symbolic_match(answer, ground_truth), timeout_s)
    return bool(verdict)


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def math_score(
    response: str,
    ground_truth: object,
    *,
    require_boxed: bool = False,
    fallback: str = "answer_phrase_or_last_number",
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
    format_score: float = 0.0,
    timeout_s: float = 5.0,
) -> tuple[float, str]:
    """Score ``response`` against ``ground_truth``: ``(correct_score, "correct")``, ``(wrong_score, "wrong answer:
    got X, expected Y")``, or ``(format_score, "no \\boxed answer")`` when no answer can be extracted."""
    truth = str(ground_truth if ground_truth is not None else "").strip()
    if not truth:
        return wrong_score, "missing ground_truth"
    answer = extract_answer(response or "", "none" if require_boxed else fallback)
    if answer is None:
        return format_score, "no \\boxed answer" if require_boxed or fallback == "none" else "no answer found"
    try:
        correct = answers_match(answer, truth, timeout_s)
    except TimeoutError as e:
        return wrong_score, str(e)
    if correct:
        return correct_score, "correct"
    return wrong_score, f"wrong answer: got {_clip(answer)}, expected {_clip(truth)}"


class MathRewardWorker(RewardWorker):
    """Scores rows by :func:`math_score` on ``response_text`` and ``ground_truth``.

    reward_kwargs: ``correct_score`` (1.0), ``wrong_score`` (0.0), ``format_score`` (0.0, no answer found),
    ``require_boxed`` (False), ``fallback`` ("answer_phrase_or_last_number"), ``timeout_s`` (5.0).
    """

    required_fields = (("ground_truth",),)

    default_kwargs = {
        "correct_score": 1.0,
        "wrong_score": 0.0,
        "format_score": 0.0,
        "require_boxed": False,
        "fallback": "answer_phrase_or_last_number",
        "timeout_s": 5.0,
    }

    def setup(self, kwargs: dict[str, Any]) -> None:
        if kwargs["fallback"] not in FALLBACKS:
            raise ConfigError(f"reward_kwargs.fallback must be one of {FALLBACKS}, got {kwargs['fallback']!r}")
        for key in ("correct_score", "wrong_score", "format_score", "timeout_s"):
            if not isinstance(kwargs[key], int | float) or isinstance(kwargs[key], bool):
                raise ConfigError(f"reward_kwargs.{key} must be a number, got {kwargs[key]!r}")
        self.score_kwargs = {k: kwargs[k] for k in self.default_kwargs}
        _math_verify()  # import once up front rather than inside the first scoring thread

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        return math_score(row.get("response_text") or "", row.get("ground_truth"), **self.score_kwargs)
