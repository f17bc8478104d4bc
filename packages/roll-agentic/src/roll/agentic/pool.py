"""EnvPool: the env managers of one process, keyed by env slot, run concurrently on one event loop.

The EnvironmentWorker actor wraps a pool; tests and benchmarks use one directly. A slot runs one episode at a
time; episodes of different slots interleave freely (each awaits the policy and its env calls).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roll.agentic.config import ROCK_ENV, CustomEnvConfig, EnvManagerConfig, LLMProxyConfig
from roll.agentic.driver_envs import DriverEnvs, NotBuiltHere
from roll.agentic.env import check_env, make_env, resolve_env_factory
from roll.agentic.env.base import EnvLike, close_env, random_action_of
from roll.agentic.env_manager import ENV_MANAGERS, ChatFormatter, EnvManager, EnvRunner, EpisodeResult, EpisodeTask
from roll.agentic.env_manager.runner import EnvFault, build_off_loop
from roll.agentic.policy.openai_proxy import OpenAIProxyClient
from roll.agentic.policy.protocol import PolicyClient
from roll.agentic.policy.random_actions import RandomActionClient
from roll.agentic.tools import ToolEnvWrapper, check_tool, tool_wrapper
from roll.pipelines.data import DataError
from roll.runtime import ConfigError, ModuleImportError, RollError, import_target
from roll.strategies import GenerationConfig

__all__ = ["CLOSE_TIMEOUT_S", "EnvPool", "EnvSlot", "build_env", "check_env_spec", "check_random_actions", "env_checks"]

CLOSE_TIMEOUT_S = 20.0
"""Longest :meth:`EnvPool.close` waits for its envs' ``close()`` in all (the scheduler gives a worker's close 30 s)."""


@dataclass(frozen=True)
class EnvSlot:
    """One env instance of a rollout: its global id, its group and its tag."""

    env_id: int
    group_id: int
    tag: str


def build_env(spec: CustomEnvConfig) -> EnvLike:
    """The env of a ``custom_envs`` entry, with its tools when ``tool_wrapper`` is set."""
    env = make_env(spec.env_type, **spec.env_config)
    if spec.tool_wrapper is not None:
        configs = [c.model_dump() for c in spec.tool_wrapper.tool_configs]
        env = tool_wrapper(env, dict(spec.tool_wrapper.wrapper_args), configs)
    return env


def check_env_spec(tag: str, spec: CustomEnvConfig) -> str:
    """``roll validate``: the entry's env type resolves to an env and takes its ``env_config``, and each tool of its
    ``tool_wrapper`` resolves and takes its ``tool_args``; nothing is built, but an env class's own ``check_args`` runs
    (dataset envs read a local dataset). A ConfigError (or DataError) names ``custom_envs.<tag>``."""
    wrapped = [c.model_dump() for c in spec.tool_wrapper.tool_configs] if spec.tool_wrapper is not None else []
    configs = [(f"custom_envs.{tag}.tool_wrapper.tool_configs[{i}].tool_id", c) for i, c in enumerate(wrapped)]
    nested = spec.env_config.get("tool_configs")  # envs that wrap themselves (tool_math) take ROLL's tool_configs
    if isinstance(nested, list):
        configs += [
            (f"custom_envs.{tag}.env_config.tool_configs[{i}].tool_id", c)
            for i, c in enumerate(nested)
            if isinstance(c, dict) and "tool_id" in c
        ]
    try:
        factory = check_env(spec.env_type, spec.env_config, setting=f"custom_envs.{tag}.env_type")
        for setting, config in configs:
            check_tool(config["tool_id"], config.get("tool_args") or {}, setting=setting)
        check_args = getattr(factory, "check_args", None)
        note = check_args(**spec.env_config) if isinstance(factory, type) and callable(check_args) else None
    except ModuleImportError:
        raise  # it names the setting (custom_envs.<tag>.env_type, a tool_id) itself, and keeps the module's error
    except (ConfigError, DataError) as e:
        # the same type: roll validate --no-ray reports what is about this machine only (NotHereError) as a warning
        raise type(e)(f"custom_envs.{tag}: {e}") from e
    name = getattr(factory, "__name__", None) or getattr(getattr(factory, "func", None), "__name__", "a factory")
    tools = f", tools {[c['tool_id'] for _, c in configs]}" if configs else ""
    return f"{tag}: env_type {spec.env_type!r} ({name}){tools}" + (f"; {note}" if note else "")


def env_checks(
    custom_envs: Mapping[str, CustomEnvConfig],
    managers: Sequence[EnvManagerConfig] = (),
    envs: DriverEnvs | None = None,
) -> list[Callable[[], str | None]]:
    """:func:`check_env_spec` for every entry but ROCK's (checked by roll.agentic.env.rock.checks), and
    :func:`check_random_actions` for each tag of the ``managers`` whose ``llm_proxy`` is ``random`` (with ``envs``,
    the driver's envs it shares with the length checks; the caller closes them)."""
    checks: list[Callable[[], str | None]] = [
        functools.partial(check_env_spec, tag, spec) for tag, spec in custom_envs.items() if spec.env_type != ROCK_ENV
    ]
    randoms = [m for m in managers if m.llm_proxy.proxy_type == "random"]
    tags = dict.fromkeys(tag for manager in randoms for tag in manager.tags if tag in custom_envs)
    return checks + [functools.partial(check_random_actions, tag, custom_envs[tag], envs) for tag in tags]


def _no_random_action(tag: str, spec: CustomEnvConfig, wrapped: bool) -> ConfigError:
    return ConfigError(
        f"custom_envs.{tag}: env_type {spec.env_type!r}{' (inside its tool wrapper)' if wrapped else ''} has no "
        "sample_random_action(), which llm_proxy.proxy_type random plays; use proxy_type policy for this tag"
    )


def _class_has_random_action(factory: Any) -> bool | None:
    """Whether the envs ``factory`` builds have ``sample_random_action``, as their class says; None where only an
    env can tell (a factory function, a class that computes it: a property, ``__getattr__``)."""
    cls = factory.func if isinstance(factory, functools.partial) else factory
    if not isinstance(cls, type) or hasattr(cls, "__getattr__"):
        return None
    method = inspect.getattr_static(cls, "sample_random_action", None)
    if method is None:
        return False
    return True if callable(method) or isinstance(method, staticmethod | classmethod) else None


def check_random_actions(tag: str, spec: CustomEnvConfig, envs: DriverEnvs | None = None) -> str | None:
    """``llm_proxy.proxy_type: random`` plays each turn with the env's ``sample_random_action()`` (a tool wrapper
    passes its wrapped env's): a tag whose env has none is refused here, by ``roll validate`` and the pipelines'
    setup, with the message :class:`EnvPool` would give once the workers had started. The env class answers where it
    can; else the tag's env is built in the driver by ``envs`` (shared with the first-prompt length check, so it is
    built once; a build that fails or takes over its timeout is left to :func:`check_env_spec` and the run)."""
    try:
        known = _class_has_random_action(resolve_env_factory(spec.env_type))
    except RollError:  # an unknown env type or a missing extra: check_env_spec reports it
        return None
    wrapped = spec.tool_wrapper is not None
    if known is None:
        own = envs is None
        driver = DriverEnvs() if envs is None else envs
        try:
            env = driver.get(tag, spec)
            known = random_action_of(env) is not None
            wrapped = wrapped or isinstance(env, ToolEnvWrapper)
        except NotBuiltHere as e:
            return f"{tag}: random actions not checked here ({e})"
        finally:
            if own:
                driver.close()
    if not known:
        raise _no_random_action(tag, spec, wrapped)
    return f"{tag}: env_type {spec.env_type!r} has sample_random_action() for llm_proxy random"


def manager_class(name: str) -> type[EnvManager]:
    cls = ENV_MANAGERS.get(name) if name in ENV_MANAGERS or "." not in name else import_target(name, "env_manager_cls")
    if not (isinstance(cls, type) and issubclass(cls, EnvManager)):
        raise ConfigError(f"env_manager_cls {name!r} is not an EnvManager subclass")
    return cls


class EnvPool:
    """Env managers for the slots given to :meth:`add_slots`, sharing a tokenizer, a client and limits.

    ``llm_proxy`` (the manager's): ``openai`` answers every slot with one
    :class:`~roll.agentic.policy.OpenAIProxyClient` instead of ``client``; ``random`` gives each slot a
    :class:`~roll.agentic.policy.RandomActionClient` over its own env.
    """

    def __init__(
        self,
        custom_envs: dict[str, CustomEnvConfig],
        tokenizer: Any,
        client: PolicyClient,
        *,
        generation_config: GenerationConfig,
        sequence_length: int,
        llm_proxy: LLMProxyConfig | None = None,
    ) -> None:
        self.proxy_type = llm_proxy.proxy_type if llm_proxy is not None else "policy"
        if llm_proxy is not None and llm_proxy.proxy_type == "openai":
            client = OpenAIProxyClient(tokenizer, **llm_proxy.proxy_config)
        self.custom_envs, self.client = custom_envs, client
        self.generation_config, self.sequence_length = generation_config, sequence_length
        self.formatter = ChatFormatter(tokenizer)  # the template's own default; each tag renders with its own setting
        self._formatters: dict[bool | None, ChatFormatter] = {None: self.formatter}
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else tokenizer.eos_token_id)
        self.managers: dict[int, EnvManager] = {}
        self.slots: dict[int, EnvSlot] = {}
        self._busy: dict[int, asyncio.Lock] = {}
        # Envs drawing from process-global RNGs (or tags with use_thread_lock) take turns on this lock.
        self._serial_lock = asyncio.Lock()
        self._limiters: dict[str, asyncio.Semaphore] = {}

    def _spec(self, tag: str) -> CustomEnvConfig:
        if tag not in self.custom_envs:
            raise ConfigError(f"env tag {tag!r} is not in custom_envs ({sorted(self.custom_envs)})")
        return self.custom_envs[tag]

    def _formatter(self, enable_thinking: bool | None) -> ChatFormatter:
        if enable_thinking not in self._formatters:
            self._formatters[enable_thinking] = ChatFormatter(self.formatter.tokenizer, enable_thinking)
        return self._formatters[enable_thinking]

    def make_manager(self, slot: EnvSlot, env: EnvLike | None = None) -> EnvManager:
        """The env manager of ``slot``, its env built, or ``env`` when given (one the driver built: a rebuild after
        a fault builds afresh); not added to the pool: :meth:`add_slots` does that."""
        spec = self._spec(slot.tag)
        built = [env] if env is not None else []
        limiter = None
        if spec.max_env_step_concurrent > 0:
            limiter = self._limiters.setdefault(slot.tag, asyncio.Semaphore(spec.max_env_step_concurrent))
        cls = manager_class(spec.env_manager_cls)
        messages = bool(getattr(cls, "message_observations", False))
        try:
            runner = EnvRunner(
                lambda: built.pop() if built else build_env(spec),
                spec.step_timeout_s,
                limiter=limiter,
                messages=messages,
            )
        except (ConfigError, DataError) as e:  # e.g. a dataset that cannot be read: say which entry
            raise type(e)(f"custom_envs.{slot.tag}: {e}") from e
        if spec.use_thread_lock or getattr(runner.env, "uses_global_rng", False):
            runner.lock = self._serial_lock
        client = self.client
        if self.proxy_type == "random":
            if random_action_of(runner.env) is None:
                error = _no_random_action(slot.tag, spec, isinstance(runner.env, ToolEnvWrapper))
                runner.close()
                raise error
            client = RandomActionClient(runner, self.formatter.tokenizer)
        return cls(
            tag=slot.tag,
            spec=spec,
            runner=runner,
            formatter=self._formatter(spec.enable_thinking),
            client=client,
            generation_config=self.generation_config,
            sequence_length=self.sequence_length,
            pad_token_id=self.pad_token_id,
        )

    def add_slots(self, slots: list[EnvSlot]) -> None:
        """Build the envs of ``slots`` (slots already present are kept as they are)."""
        for slot in slots:
            if slot.env_id not in self.managers:
                self.managers[slot.env_id] = self.make_manager(slot)
                self.slots[slot.env_id] = slot
                self._busy[slot.env_id] = asyncio.Lock()

    async def run_episode(self, task: EpisodeTask) -> EpisodeResult:
        """Play ``task`` on its slot's env (built now if the slot is new here, e.g. moved from a dead worker: off the
        event loop, within the tag's ``step_timeout_s``; a build that fails or times out ends this episode as an env
        fault, and the slot's next episode builds again)."""
        if task.env_id not in self.managers:
            spec = self._spec(task.tag)
            try:
                env = await build_off_loop(
                    lambda: build_env(spec), spec.step_timeout_s, "building the moved slot's env"
                )
            except EnvFault as fault:  # as an env manager reports a reset that faulted
                return EpisodeResult.unplayed(task, fault.reason, str(fault))
            if task.env_id not in self.managers:
                slot = EnvSlot(task.env_id, task.group_id, task.tag)
                self.managers[slot.env_id] = self.make_manager(slot, env)
                self.slots[slot.env_id], self._busy[slot.env_id] = slot, asyncio.Lock()
            else:  # built meanwhile by another call
                close_env(env)
        async with self._busy[task.env_id]:
            return await self.managers[task.env_id].run_episode(task)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close every env, waiting up to ``timeout_s`` in all for their ``close()`` (run on threads of their own):
        the worker's process may end right after, and a close cut short leaves a remote sandbox or session running."""
        managers = list(self.managers.values())
        for manager in managers:
            manager.close()
        deadline = time.monotonic() + timeout_s
        for manager in managers:
            closing = manager.runner.closing
            if closing is not None:
                closing.join(max(0.0, deadline - time.monotonic()))
        self.managers.clear()
