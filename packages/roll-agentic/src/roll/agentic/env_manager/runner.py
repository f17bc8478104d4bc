"""Calling an environment safely from an event loop: off-loop, with a timeout, with faults turned into reasons.

An env's ``reset``/``step`` is ordinary blocking Python. :class:`EnvRunner` runs each call on the env's own daemon
thread and waits for it with ``step_timeout_s``; an env that raises, hangs or answers in the wrong shape ends the episode
with an :class:`EnvFault` whose ``reason`` is ``env_error``, ``env_timeout`` or ``env_malformed``. The env instance
is then discarded (its state is unknown, and a hung call may still be running) and a fresh one is built for the
next episode, on the env's thread within the same timeout (a slow constructor holds up no other env).

An env that draws from the process-global RNGs (``uses_global_rng``, e.g. GEM's: 2048 places its new tiles with
``random`` in ``step``) keeps its own copy of their state: each call starts from the state the env's previous call
left and saves it after, so episodes interleaved on one event loop draw as if each ran alone (envs of one group, same
seed and same actions, stay identical). The pool serializes such envs' calls on one lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import random
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from roll.agentic.env.base import (
    EnvLike,
    EnvOutputError,
    check_reset_output,
    check_step_output,
    close_env,
    random_action_of,
)
from roll.agentic.env.tool_calls import check_messages

__all__ = ["FAULT_REASONS", "EnvFault", "EnvRunner", "build_off_loop"]

FAULT_REASONS = ("env_error", "env_timeout", "env_malformed")


class EnvFault(Exception):
    """An environment call failed; ``reason`` is one of :data:`FAULT_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _CallThread:
    """A daemon thread that runs one env's calls in order (starting a thread per call costs milliseconds).

    A hung env must not keep the process alive at exit, hence a daemon thread rather than an executor's worker.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Callable[..., None]] | None]
        self._queue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="roll-env-calls", daemon=True).start()

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, deliver = item
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the awaiting coroutine, which decides what it means
                deliver(False, e)
            else:
                deliver(True, result)

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if future.done():  # the caller stopped waiting (timeout)
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def deliver(ok: bool, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be closed by then
                loop.call_soon_threadsafe(settle, ok, value)

        self._queue.put((fn, args, deliver))
        return future

    def stop(self) -> None:
        """Let the thread end after its current call (a hung call keeps it alive; it is a daemon)."""
        self._queue.put(None)


def _random_action(env: EnvLike) -> Callable[[int | None], str]:
    sample = random_action_of(env)
    if sample is None:  # the pool checks the env it builds; a rebuilt one is of the same kind
        raise EnvFault("env_error", f"{type(env).__name__} has no sample_random_action()")
    return sample


def _close_quietly(close: Callable[[], Any]) -> None:
    with contextlib.suppress(Exception):  # a broken env failing to close changes nothing: it is dropped anyway
        close()


class _GlobalRngState:
    """One env's copy of the process-global RNG states (``random`` and ``numpy.random``)."""

    def __init__(self) -> None:
        self.saved: tuple[Any, Any] | None = None  # until the env's first call: that call starts from the current state

    def around(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run from this env's saved state, saving the state it leaves (also when it raises)."""

        def call(*args: Any) -> Any:
            if self.saved is not None:
                random.setstate(self.saved[0])
                np.random.set_state(self.saved[1])
            try:
                return fn(*args)
            finally:
                self.saved = (random.getstate(), np.random.get_state())

        return call


async def build_off_loop(make: Callable[[], EnvLike], timeout_s: float, doing: str) -> EnvLike:
    """``make()`` on a daemon thread of its own, within ``timeout_s``, as an :class:`EnvFault` (``env_timeout``,
    ``env_error``) when it fails. An env built while episodes run (a rebuild after a fault, a slot moved from a lost
    worker) must not stop the event loop: a slow constructor (an MCP server starting, a dataset loading), or one that
    hangs, would stall every other env of the worker and their timeouts with it."""
    thread, abandoned = _CallThread(), threading.Event()

    def build() -> EnvLike:
        env = make()
        if abandoned.is_set():  # built after its timeout: nobody will use or close it
            _close_quietly(lambda: close_env(env))
        return env

    try:
        env: EnvLike = await asyncio.wait_for(thread.submit(asyncio.get_running_loop(), build), timeout_s)
        return env
    except TimeoutError:
        abandoned.set()
        raise EnvFault("env_timeout", f"{doing} did not finish within {timeout_s:g} s") from None
    except (Exception, SystemExit) as e:  # an env calling sys.exit() is an env error too, as in its calls
        raise EnvFault("env_error", f"{doing} failed: {type(e).__name__}: {e}") from e
    finally:
        thread.stop()


class EnvRunner:
    """Owns one environment (built by ``make``) and runs its calls with ``timeout_s``.

    ``lock`` (shared by envs that must not run at once, e.g. ones drawing from global RNGs) and ``limiter`` (a cap
    on concurrent env calls) are held for the duration of a call.
    """

    def __init__(
        self,
        make: Callable[[], EnvLike],
        timeout_s: float,
        lock: asyncio.Lock | None = None,
        limiter: asyncio.Semaphore | None = None,
        messages: bool = False,
    ) -> None:
        self.make, self.timeout_s = make, timeout_s
        #: Agent-native envs answer with a list of chat messages: it is checked and handed on as its JSON text.
        self.messages = messages
        self.lock, self.limiter = lock, limiter
        self.env: EnvLike | None = make()  # eager: a bad env_config fails at initialize, not mid-rollout
        self.rebuilds = 0
        self._rng = _GlobalRngState() if getattr(self.env, "uses_global_rng", False) else None
        self._thread: _CallThread | None = None
        #: The thread closing the last discarded env (closes are not waited for: a hung env may hang there too);
        #: the pool's close joins it, so that a worker's envs (a sandbox, a session) are closed before it exits.
        self.closing: threading.Thread | None = None

    @property
    def serialized(self) -> bool:
        return self.lock is not None

    def _discard(self) -> None:
        if self._thread is not None:  # it may be stuck in the env: the next call gets a fresh thread
            self._thread.stop()
            self._thread = None
        env, self.env = self.env, None
        close = getattr(env, "close", None)
        if callable(close):
            # Closing a hung env could hang as well: do it on its own daemon thread and do not wait.
            self.closing = threading.Thread(target=_close_quietly, args=(close,), name="roll-env-close", daemon=True)
            self.closing.start()

    async def _rebuild(self) -> EnvLike:
        """A fresh env after a fault, built off the event loop (:func:`build_off_loop`)."""
        self.env = await build_off_loop(self.make, self.timeout_s, "rebuilding the env")
        self.rebuilds += 1
        return self.env

    async def _call(self, method: str, *args: Any, bind: Callable[[EnvLike], Any] | None = None) -> Any:
        """``env.<method>(*args)`` (or ``bind(env)(*args)``: ``method`` then only names the call in errors)."""
        loop = asyncio.get_running_loop()
        async with self.limiter or contextlib.nullcontext(), self.lock or contextlib.nullcontext():
            if self._thread is None:
                self._thread = _CallThread()
            env = self.env if self.env is not None else await self._rebuild()
            fn = bind(env) if bind is not None else getattr(env, method)
            future = self._thread.submit(loop, self._rng.around(fn) if self._rng else fn, *args)
            try:
                return await asyncio.wait_for(future, self.timeout_s)
            except TimeoutError:
                self._discard()
                raise EnvFault("env_timeout", f"{method}() did not return within {self.timeout_s:g} s") from None
            except EnvOutputError as e:  # an adapter (GemEnv, the tool wrapper) checked its inner env's output
                self._discard()
                raise EnvFault("env_malformed", str(e)) from e
            except (Exception, SystemExit) as e:  # an env calling sys.exit() is an env error too
                self._discard()
                raise EnvFault("env_error", f"{method}() raised {type(e).__name__}: {e}") from e

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        output = await self._call("reset", seed)
        try:
            return check_reset_output(self._as_text(output, "reset()", 2))
        except EnvOutputError as e:
            self._discard()
            raise EnvFault("env_malformed", str(e)) from e

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        output = await self._call("step", action)
        try:
            return check_step_output(self._as_text(output, "step()", 5))
        except EnvOutputError as e:
            self._discard()
            raise EnvFault("env_malformed", str(e)) from e

    async def sample_random_action(self, seed: int | None = None) -> str:
        """The env's own random action (``llm_proxy.proxy_type: random``), run like the env's other calls; ``seed``
        (the turn's) goes to an env whose method takes one (:func:`~roll.agentic.env.base.random_action_of`)."""
        action = await self._call("sample_random_action", seed, bind=_random_action)
        if not isinstance(action, str):
            raise EnvFault("env_malformed", f"sample_random_action() returned {type(action).__name__}, not a str")
        return action

    def _as_text(self, output: Any, where: str, size: int) -> Any:
        if not self.messages or not isinstance(output, tuple) or len(output) != size:
            return output  # the checks name what is wrong with the shape
        try:
            messages = check_messages(output[0], where)
        except ValueError as e:
            raise EnvOutputError(str(e)) from None
        return (json.dumps(messages, ensure_ascii=False), *output[1:])

    def close(self) -> None:
        self._discard()
