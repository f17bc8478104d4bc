"""The environment contract: GEM's text API, seeded and deterministic.

An environment is any object with::

    reset(seed: int | None = None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)

(``close()`` is optional). Classes from the ``gem-llm`` package satisfy it as they are; :class:`Env` is a
convenience base for our own. Equal seeds must give equal episodes for equal actions: GRPO-style groups rely on
every member starting from the same state.

``info`` keys the env managers read (all optional):

* ``success`` (bool): the task is solved (the metric ``val/success`` is built from it; for ROLL-style envs it may
  also sit in ``info["metrics"]["success"]``).
* ``action_is_valid`` (bool): the response parsed into an action (``val/format``); an unparsable action should
  earn the env's ``format_penalty``.
* ``env_instruction`` (str, on reset): rules of the game, shown once at the start of the conversation.
* ``use_tool`` (bool, on step): the observation is a tool result (rendered as a ``tool`` message).
* ``metrics`` (dict[str, float]): extra per-step numbers averaged into the episode's metrics.

An env may also offer ``sample_random_action(seed: int | None = None) -> str``, the action ``llm_proxy.proxy_type:
random`` plays (:func:`random_action_of`). With a seed it must be a pure function of the seed (and the env's state)
and leave the episode's own RNG alone; GEM's envs take no seed (their adapter seeds them, :mod:`roll.agentic.env.gem`).
"""

from __future__ import annotations

import hashlib
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from roll.runtime import ConfigError, RollError

__all__ = [
    "Env",
    "EnvLike",
    "EnvOutputError",
    "ResetOutput",
    "StepOutput",
    "check_reset_output",
    "check_step_output",
    "close_env",
    "draw_in_split",
    "grid_lookup_of",
    "info_flag",
    "keys_passed_on",
    "random_action_of",
]

ResetOutput = tuple[str, dict[str, Any]]
StepOutput = tuple[str, float, bool, bool, dict[str, Any]]
Layout = TypeVar("Layout")  # what an env draws at reset: a map, a room, a question


@runtime_checkable
class EnvLike(Protocol):
    """Structural type of an environment (GEM's API)."""

    def reset(self, seed: int | None = None) -> ResetOutput: ...

    def step(self, action: str) -> StepOutput: ...


class Env(ABC):
    """Base class for roll's text environments."""

    #: True when the env draws from process-global RNGs (``random``, ``np.random``) after seeding them, as GEM's
    #: envs do: the env managers then never run two of its calls at once, and each env's calls continue from the
    #: RNG state its own previous call left, so concurrent episodes stay seeded.
    uses_global_rng: bool = False

    #: True when the seed picks an item of a fixed list (a dataset's questions: ``seed % len``): validation then
    #: gives the n-th round of the env's tag the seed n (0, 1, 2, ...) instead of a hashed seed, so a val run asks
    #: the items in order, each once as far as the batch goes. An env class may also define a classmethod
    #: ``check_args(**env_config) -> str | None`` that ``roll validate`` calls (e.g. to read its dataset).
    seed_is_index: bool = False

    @abstractmethod
    def reset(self, seed: int | None = None) -> ResetOutput:
        """Start an episode; the same ``seed`` always gives the same initial state."""

    @abstractmethod
    def step(self, action: str) -> StepOutput:
        """Apply the model's response (raw text) and return the next observation, reward and end flags."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (subprocesses, connections)."""


class EnvOutputError(RollError):
    """An environment returned something that is not GEM's ``(obs, info)`` / ``(obs, r, term, trunc, info)``."""


def _check_info(info: Any, where: str) -> dict[str, Any]:
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise EnvOutputError(f"{where}: info must be a dict, got {type(info).__name__}")
    return info


def check_reset_output(output: Any) -> ResetOutput:
    """``(observation, info)`` from ``reset``, or :class:`EnvOutputError` saying what is wrong."""
    if not isinstance(output, tuple) or len(output) != 2:
        raise EnvOutputError(f"reset() must return (observation, info), got {_describe(output)}")
    observation, info = output
    if not isinstance(observation, str):
        raise EnvOutputError(f"reset(): the observation must be text, got {type(observation).__name__}")
    return observation, _check_info(info, "reset()")


def check_step_output(output: Any) -> StepOutput:
    """``(observation, reward, terminated, truncated, info)`` from ``step``, normalised to Python types."""
    if not isinstance(output, tuple) or len(output) != 5:
        raise EnvOutputError(
            f"step() must return (observation, reward, terminated, truncated, info), got {_describe(output)}"
        )
    observation, reward, terminated, truncated, info = output
    if not isinstance(observation, str):
        raise EnvOutputError(f"step(): the observation must be text, got {type(observation).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvOutputError(f"step(): the reward must be a finite number, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        # numpy's bool is no int subclass (and numpy 2 names its type "bool", not "bool_")
        if not isinstance(flag, bool | numbers.Integral | np.bool_):
            raise EnvOutputError(f"step(): {name} must be a bool, got {flag!r}")
    return observation, float(reward), bool(terminated), bool(truncated), _check_info(info, "step()")


def info_flag(info: dict[str, Any], key: str) -> bool | None:
    """``info[key]``, falling back to ROLL's ``info["metrics"][key]``; ``None`` when the env does not say."""
    value = info.get(key)
    if value is None and isinstance(info.get("metrics"), dict):
        value = info["metrics"].get(key)
    return None if value is None else bool(value)


def close_env(env: object) -> None:
    """``env.close()`` where the env has one (GEM's API makes it optional)."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def keys_passed_on(*classes: type) -> inspect.Signature:
    """The keyword arguments ``classes[0]`` takes, those its ``**kwargs`` passes on to ``classes[1:]`` (in order)
    included: set it as the first class's ``__signature__`` so that ``check_env`` (``roll validate``, the env pool's
    setup) names a misspelt ``env_config`` key instead of the first env build failing with a TypeError. Read from
    each class's own ``__init__`` (each must define one), so a parent's ``__signature__`` does not hide a subclass's
    keys."""
    params: dict[str, inspect.Parameter] = {}
    for cls in classes:
        for name, param in list(inspect.signature(vars(cls)["__init__"]).parameters.items())[1:]:  # [1:]: self
            if param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL) and name not in params:
                params[name] = param.replace(kind=param.KEYWORD_ONLY)
    return inspect.Signature(list(params.values()))


def random_action_of(env: object) -> Callable[[int | None], str] | None:
    """``env.sample_random_action`` as a function of the turn's seed, or None when the env has none. A method with
    a ``seed`` parameter gets it (by name); one without (GEM's signature) is called bare and draws as it draws."""
    sample = getattr(env, "sample_random_action", None)
    if not callable(sample):
        return None
    try:
        takes_seed = "seed" in inspect.signature(sample).parameters
    except (TypeError, ValueError):  # a builtin without a readable signature
        takes_seed = False
    if takes_seed:
        return lambda seed: sample(seed=seed)
    return lambda seed: sample()


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    return type(value).__name__


def grid_lookup_of(grid_lookup: dict[Any, str] | None, default: dict[int, str]) -> dict[int, str]:
    """A grid env's cell-code -> symbol table with int keys (YAML may give them as strings); ``default`` when None."""
    return {int(k): v for k, v in (grid_lookup or default).items()}


def layout_split(key: str, val_fraction: float) -> str:
    """``"val"`` for a stable ``val_fraction`` share of layouts (a map, a room, a question, as text), else
    ``"train"``: every layout is in exactly one split, so validation on ``split="val"`` never replays a training
    layout, whatever the seeds."""
    digest = hashlib.sha256(key.encode()).digest()
    return "val" if int.from_bytes(digest[:4], "little") / 2**32 < val_fraction else "train"


MAX_SPLIT_DRAWS = 10_000  # a split with val_fraction 0.01 misses that often with probability ~1e-44


def draw_in_split(
    draw: Callable[[], Layout], text: Callable[[Layout], str], split: str | None, val_fraction: float, settings: str
) -> Layout:
    """The first layout ``draw()`` gives that falls in ``split`` (its :func:`layout_split` of ``text(layout)``; any
    with ``split`` None). Settings whose layouts hardly ever fall in the split (a handful of distinct layouts, none
    in it) raise a ConfigError after :data:`MAX_SPLIT_DRAWS` draws, naming ``settings`` and the fix."""
    for _ in range(MAX_SPLIT_DRAWS):
        layout = draw()
        if split is None or layout_split(text(layout), val_fraction) == split:
            return layout
    raise ConfigError(
        f"{settings}: no layout of split={split!r} in {MAX_SPLIT_DRAWS} draws with val_fraction={val_fraction}; "
        "these settings leave too few distinct layouts for two splits: widen them or change val_fraction"
    )


def check_split(env: str, split: str | None, val_fraction: float) -> None:
    if split not in (None, "train", "val"):
        raise ConfigError(f"{env} split={split!r} must be 'train', 'val' or null")
    if not 0 < val_fraction < 1:
        raise ConfigError(f"{env} val_fraction={val_fraction} must be in (0, 1)")
