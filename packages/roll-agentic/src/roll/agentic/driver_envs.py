"""Envs built in the driver by the load-time checks, one per tag, each build given up on after a timeout.

Two start-up checks need a built env: ``llm_proxy.proxy_type: random`` asks one whether it has
``sample_random_action()`` where its class cannot tell (:func:`roll.agentic.pool.check_random_actions`), and the
first-prompt length check renders its first prompt (:mod:`roll.agentic.pipeline.lengths`). Sharing one
:class:`DriverEnvs` builds each tag once for both, and no build holds ``roll validate`` or a pipeline's setup longer
than :data:`BUILD_TIMEOUT_S`: an env whose constructor hangs is reported, by tag, as not built here. An env that
refuses its settings (a ``ConfigError`` from its constructor, e.g. ``frozen_lake`` with ``size: -3``) fails the check
with the tag named; any other build error is reported as not built here (the driver may lack a service or file that
the workers have).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env.base import EnvLike, close_env
from roll.runtime import ConfigError

__all__ = ["BUILD_TIMEOUT_S", "DriverEnvs", "NotBuiltHere", "in_thread"]

BUILD_TIMEOUT_S = 30.0
"""Longest the driver waits for one env tag to be built (and, by the length check, reset) before it skips the check."""
T = TypeVar("T")


class NotBuiltHere(Exception):
    """The env of a tag is not built (or not reset) in the driver: the check that needed it is skipped with this
    reason (the run's workers meet the problem, if it is one, when they build the env)."""


def in_thread(fn: Callable[[], T], timeout_s: float, doing: str) -> T:
    """``fn()`` on a daemon thread, given up on after ``timeout_s`` with ``NotBuiltHere("<doing> took over ...")``
    (an env that hangs must not hold the driver); the process-global RNGs are left as they were (GEM's envs draw
    from them)."""
    saved = random.getstate(), np.random.get_state()
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            out["error"] = e

    thread = threading.Thread(target=target, name="roll-driver-env", daemon=True)
    thread.start()
    thread.join(timeout_s)
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    if thread.is_alive():
        raise NotBuiltHere(f"{doing} took over {timeout_s:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


class DriverEnvs:
    """Each tag's env built once in the driver (as :func:`~roll.agentic.pool.build_env` builds it, tool wrapper
    included), within ``timeout_s``; a failed, refused or timed-out build is remembered, not retried. :meth:`close` closes
    the envs no check took."""

    def __init__(self, timeout_s: float | None = None) -> None:
        self.timeout_s = BUILD_TIMEOUT_S if timeout_s is None else timeout_s
        self._envs: dict[str, EnvLike] = {}
        self._failed: dict[str, str] = {}
        self._refused: dict[str, ConfigError] = {}

    def get(self, tag: str, spec: CustomEnvConfig) -> EnvLike:
        """The env of ``tag``, built now if not yet. Raises the env's ``ConfigError`` (its settings are refused:
        ``roll validate`` and the run's setup fail on it, naming the tag) or ``NotBuiltHere`` with the reason it is
        not built here (a timeout, or any other error: the driver may lack what the workers have)."""
        from roll.agentic.pool import build_env

        if tag in self._refused:
            raise self._refused[tag]
        if tag in self._failed:
            raise NotBuiltHere(self._failed[tag])
        if tag not in self._envs:
            try:
                self._envs[tag] = in_thread(lambda: build_env(spec), self.timeout_s, "building its env")
            except NotBuiltHere as e:
                self._failed[tag] = str(e)
                raise
            except ConfigError as e:  # the env refuses its settings: every worker would too, so the check fails
                self._refused[tag] = ConfigError(f"env tag {tag!r} ({spec.env_type}): {e}")
                raise self._refused[tag] from e
            except Exception as e:  # e.g. a service or file the driver cannot reach; the workers may
                self._failed[tag] = f"building its env failed: {type(e).__name__}: {e}"
                raise NotBuiltHere(self._failed[tag]) from e
        return self._envs[tag]

    def take(self, tag: str, spec: CustomEnvConfig) -> EnvLike:
        """:meth:`get`, handing the env over: the caller closes it."""
        env = self.get(tag, spec)
        del self._envs[tag]
        return env

    def close(self) -> None:
        """Close the envs still held (a check that ends the list of checks: it returns no line)."""
        envs, self._envs = list(self._envs.values()), {}
        for env in envs:
            close_env(env)
