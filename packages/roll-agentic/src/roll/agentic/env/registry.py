"""Environment types by name (``env_type`` in a ``custom_envs`` entry), resolved lazily.

``make_env(env_type, **env_config)`` accepts:

* a registered name: ``frozen_lake``, ``sokoban``, ``arithmetic``, ``tool_math``, ROLL's dataset envs ``roll_math``,
  ``roll_qa``, ``roll_code``, ``atropos_env`` (an Atropos env class; needs ``roll-agentic[atropos]``), ``sokoban_mcp``
  (Sokoban on an MCP server; needs ``roll-agentic[mcp]``), ``sokoban_sandbox`` (Sokoban in a ROCK sandbox; needs
  ``roll-agentic[rock]``, or its local stand-in), ROLL's
  agent-native ``sokoban_native_env``, ``sokoban_tool_call``, ``rock_tb_native_env`` and ``openreward_env`` (needs
  ``roll-agentic[openreward]``), or one added with :func:`register_env` (or the ``roll.agentic.envs`` entry-point group);
* ``"gem:<id>"`` or a bare GEM id such as ``game:GuessTheNumber-v0-easy`` (needs ``roll-agentic[gem]``);
* a user's own class or factory by import path, ``"my_pkg.envs:MyEnv"`` or ``"my_pkg.envs.MyEnv"``. A module that
  fails while importing (a SyntaxError, an ImportError of something it imports, any error its top level raises) is an
  roll.runtime's :class:`~roll.runtime.ModuleImportError` naming the setting, the file and line, and the error
  (kept as its ``__cause__``).
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from roll.agentic.env.base import EnvLike
from roll.pipelines.compat.notes import ROLL_ENVS_NOT_BUILT
from roll.runtime import ConfigError, Registry, import_module_of, import_target

__all__ = ["ENVS", "check_env", "make_env", "register_env", "resolve_env_factory"]

ENVS: Registry[Any] = Registry("environment", entry_point_group="roll.agentic.envs")
ENVS.register("frozen_lake", "roll.agentic.env.frozen_lake:FrozenLakeEnv")
ENVS.register("sokoban", "roll.agentic.env.sokoban:SokobanEnv")
ENVS.register("arithmetic", "roll.agentic.env.math_tool:ArithmeticEnv")
ENVS.register("tool_math", "roll.agentic.env.math_tool:make_tool_math_env")
ENVS.register("sokoban_native_env", "roll.agentic.env.sokoban_native:SokobanNativeEnv")
ENVS.register("sokoban_tool_call", "roll.agentic.env.sokoban_tool_call:SokobanToolCallEnv")
ENVS.register("rock_tb_native_env", "roll.agentic.env.rock.env:RockTBNativeEnv")
ENVS.register("openreward_env", "roll.agentic.env.openreward_env:OpenRewardEnv")
ENVS.register("sokoban_mcp", "roll.agentic.env.sokoban_mcp:SokobanMCPEnv")
ENVS.register("sokoban_sandbox", "roll.agentic.env.sokoban_sandbox:SokobanSandboxEnv")
ENVS.register("roll_math", "roll.agentic.env.dataset_envs:RollMathEnv")
ENVS.register("roll_qa", "roll.agentic.env.dataset_envs:RollQaEnv")
ENVS.register("roll_code", "roll.agentic.env.dataset_envs:RollCodeEnv")
ENVS.register("atropos_env", "roll.agentic.env.atropos:AtroposEnv")


def register_env(name: str, target: str | Any, *, package: str | None = None, extra: str | None = None) -> None:
    """Register an env class or factory (or its lazy ``"module:attr"`` path) as ``env_type`` ``name``."""
    ENVS.register(name, target, package=package, extra=extra)


def _importable(path: str) -> bool:
    module = path.split(":", 1)[0] if ":" in path else path.rpartition(".")[0]
    if not module:
        return False
    if module.split(".")[0] in sys.modules:  # already loaded (also covers __main__, which has no spec)
        return True
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _gem_factory(env_id: str) -> Any:
    from functools import partial

    from roll.agentic.env.gem import GemEnv

    return partial(GemEnv, env_id)


def _gem_knows(env_id: str) -> bool:
    try:
        from roll.agentic.env.gem import gem_env_ids

        return env_id in gem_env_ids()
    except ImportError:
        return False


def _resolve(env_type: str, setting: str = "env_type") -> tuple[Any, str | None]:
    """The factory of ``env_type`` and, for a GEM env, its GEM id (``setting``: the field, for the messages)."""
    if env_type in ENVS:
        return ENVS.get(env_type, setting), None
    if env_type.startswith("gem:"):
        return _gem_factory(env_type[len("gem:") :]), env_type[len("gem:") :]
    if _importable(env_type):
        import_module_of(env_type, f"{setting}={env_type!r}")
        try:
            return import_target(env_type), None
        except (ImportError, AttributeError) as e:
            # GEM ids look like paths ("math:GSM8K" would name the stdlib's math module).
            if _gem_knows(env_type):
                return _gem_factory(env_type), env_type
            raise ConfigError(
                f"env_type {env_type!r} cannot be imported ({e}); check the path{_gem_missing_hint(env_type)}"
            ) from e
    if _gem_knows(env_type):
        return _gem_factory(env_type), env_type
    if env_type in ROLL_ENVS_NOT_BUILT:
        why = ROLL_ENVS_NOT_BUILT[env_type]
        raise ConfigError(
            f"env_type {env_type!r} is one of ROLL's envs that roll does not build: {why}; use a "
            f"registered name ({', '.join(ENVS.names())}), a GEM id as 'gem:<id>', or your own env by import path "
            "'my_package.module:MyEnv' (docs/roll-compat.md lists ROLL's env types)"
        )
    raise ConfigError(
        f"unknown env_type {env_type!r}; use a registered name ({', '.join(ENVS.names())}), a GEM id as "
        f"'gem:<id>' (pip install 'roll-agentic[gem]'), or an import path 'my_package.module:MyEnv'"
        f"{_gem_hint(env_type)}"
    )


def _gem_hint(env_type: str) -> str:
    """``"; GEM ids like it: [...]"`` when gem is installed and knows ids close to ``env_type``."""
    try:
        from roll.agentic.env.gem import gem_env_ids

        close = difflib.get_close_matches(env_type, gem_env_ids(), n=3, cutoff=0.8)
    except ImportError:
        return ""
    return f"; GEM ids like it: {close}" if close else ""


def _gem_missing_hint(env_type: str) -> str:
    """A hint for a GEM id whose prefix is also a module ("math:GSM8K", "code:CodeContest") while gem is not
    installed: it reads as an import path, and the error would otherwise point at the path only."""
    try:
        from roll.agentic.env.gem import import_gem

        import_gem()
    except ImportError:
        return ", or, if it is a GEM id, install GEM: pip install 'roll-agentic[gem]'"
    return ""


def resolve_env_factory(env_type: str) -> Any:
    """The class or factory that :func:`make_env` calls for ``env_type``."""
    return _resolve(env_type)[0]


def check_env(env_type: str, env_config: Mapping[str, Any], *, setting: str = "env_type") -> Any:
    """The class or factory :func:`make_env` calls for ``env_type``, once ``env_config`` is known to fit it, without
    building an env (``roll validate``); ConfigError naming the env type and the accepted keys otherwise
    (``setting``: the config field ``env_type`` came from, named by a :class:`~roll.runtime.ModuleImportError`)."""
    factory, gem_id = _resolve(env_type, setting)
    if gem_id is not None:
        from roll.agentic.env.gem import check_gem_env

        check_gem_env(gem_id, {k: v for k, v in env_config.items() if k != "success_reward"})
    if isinstance(factory, type) and not all(callable(getattr(factory, name, None)) for name in ("reset", "step")):
        raise _not_an_env(env_type, factory.__name__)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(**env_config)
        except TypeError as e:
            accepted = [n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD]
            raise ConfigError(
                f"env_config for env_type {env_type!r} does not fit ({e}); accepted keys: {accepted}"
            ) from None
    return factory


def _not_an_env(env_type: str, name: str) -> ConfigError:
    return ConfigError(
        f"env_type {env_type!r} gives a {name}, which has no reset(seed)/step(action); environments follow GEM's "
        "API (see roll.agentic.env.base)"
    )


def make_env(env_type: str, **env_config: Any) -> EnvLike:
    """Build one environment; bad ``env_config`` keys raise a ConfigError that lists the accepted ones."""
    env = check_env(env_type, env_config)(**env_config)
    if not isinstance(env, EnvLike):
        raise _not_an_env(env_type, type(env).__name__)
    return env
