"""Reward from a user-supplied Python function named in the config (trusted code: it runs in the worker).

``reward_kwargs: {"function": "my_package.rewards:score", "function_kwargs": {...}}``. The function is called as
``fn(prompt=..., response=..., **row_fields, **function_kwargs)`` where ``row_fields`` are the row's other
non-tensor columns (``tag``, ``ground_truth``, ...) and ``response_length``; a function without ``**kwargs`` gets
only the fields it names. It returns a number or ``(number, reason)``; anything else scores 0 with a reason.
Two small functions ship as examples: :func:`length_penalty` and :func:`exact_match`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from roll.pipelines.rewards.base import RewardWorker, safe_score
from roll.runtime import ConfigError, import_target

__all__ = [
    "PythonFunctionRewardWorker",
    "call_reward_function",
    "exact_match",
    "length_penalty",
    "load_reward_function",
]

_RESERVED = ("prompt", "response", "response_text")


def load_reward_function(target: Any) -> Callable[..., Any]:
    """The callable named by ``"package.module:function"``; ConfigError if it cannot be imported or called."""
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"reward_kwargs.function must be a 'package.module:function' string, got {target!r}")
    try:
        fn = import_target(target.strip())
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(
            f"reward_kwargs.function {target!r} cannot be imported ({type(e).__name__}: {e}); "
            f"use 'package.module:function' with a module on the workers' Python path"
        ) from e
    if not callable(fn):
        raise ConfigError(f"reward_kwargs.function {target!r} is a {type(fn).__name__}, not a callable")
    return fn


def _accepted_fields(fn: Callable[..., Any]) -> set[str] | None:
    """The keyword names ``fn`` accepts, or None when it takes ``**kwargs`` (or its signature is unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def call_reward_function(
    fn: Callable[..., Any], row: dict[str, Any], extra: dict[str, Any] | None = None
) -> tuple[float, str]:
    """Call ``fn`` on one row (see module docstring) and validate what it returns."""
    fields = {k: v for k, v in row.items() if k not in _RESERVED}
    fields.update(extra or {})
    accepted = _accepted_fields(fn)
    if accepted is not None:
        fields = {k: v for k, v in fields.items() if k in accepted}
    result = fn(prompt=row.get("prompt", ""), response=row.get("response_text", ""), **fields)
    return safe_score(result, "reward function")


def length_penalty(
    prompt: str, response: str, *, max_chars: int = 4000, penalty: float = 1.0, **_: Any
) -> tuple[float, str]:
    """0 for responses up to ``max_chars`` characters, falling linearly to ``-penalty`` at twice that length."""
    over = len(response) - max_chars
    if over <= 0:
        return 0.0, "within length"
    return -penalty * min(1.0, over / max_chars), f"{over} characters over {max_chars}"


def exact_match(prompt: str, response: str, ground_truth: Any = None, **_: Any) -> tuple[float, str]:
    """1 if the stripped response equals the stripped ``ground_truth``, else 0."""
    if ground_truth is None:
        return 0.0, "missing ground_truth"
    if response.strip() == str(ground_truth).strip():
        return 1.0, "correct"
    return 0.0, "no exact match"


class PythonFunctionRewardWorker(RewardWorker):
    """Scores rows with the function in reward_kwargs ``function`` (``function_kwargs`` are passed through)."""

    default_kwargs = {"function": None, "function_kwargs": None}

    def setup(self, kwargs: dict[str, Any]) -> None:
        self.function = load_reward_function(kwargs["function"])
        extra = kwargs["function_kwargs"] or {}
        if not isinstance(extra, dict):
            raise ConfigError(f"reward_kwargs.function_kwargs must be a mapping, got {extra!r}")
        clash = sorted(set(extra) & set(_RESERVED))
        if clash:
            raise ConfigError(f"reward_kwargs.function_kwargs may not set {clash}: they come from each row")
        self.function_kwargs = dict(extra)

    def score_row(self, row: dict[str, Any]) -> tuple[float, str]:
        return call_reward_function(self.function, row, self.function_kwargs)
