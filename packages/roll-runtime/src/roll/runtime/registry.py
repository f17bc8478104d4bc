"""Name -> implementation registries, resolved lazily.

Strategies, reward workers and environments are registered by name with a ``"module:attr"`` target, so
registering a backend never imports its heavy library; only looking it up does. Third-party packages add
entries through an entry-point group. Unknown names list the known ones; a backend whose optional
dependency is missing raises :class:`MissingExtraError` carrying the exact ``pip install`` command. A module named by a
config (an import path, or a registered name's target) that fails while importing is a :class:`ModuleImportError`
naming the setting, the file and line (:func:`import_module_of`).
"""

from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, cast

from roll.runtime.errors import ConfigError, MissingExtraError, ModuleImportError, RollError

T = TypeVar("T")

__all__ = ["Registry", "import_module_of", "import_target"]


def _module_of(target: str) -> str:
    return target.split(":", 1)[0] if ":" in target else target.rpartition(".")[0]


def _failed_at(error: BaseException) -> str:
    """Where importing a module failed: the file and line of a SyntaxError, else of the innermost frame that ran
    (and, when that is another file, the line of the module's own top level that led there)."""
    if isinstance(error, SyntaxError) and error.filename:
        at = f"{error.filename}, line {error.lineno}"
    else:
        at = ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen ")]
    bodies = [f for f in frames if f.name == "<module>"]  # the top levels of the modules being imported
    last = frames[-1] if frames and frames[-1].filename != __file__ else None
    at = at or (f"{last.filename}, line {last.lineno}" if last is not None else "")
    if bodies and not at.startswith(f"{bodies[0].filename}, line {bodies[0].lineno}"):
        at += f" (imported from {bodies[0].filename}, line {bodies[0].lineno})"
    return at


def import_module_of(target: str, where: str) -> None:
    """Import the module of import path ``target``; :class:`ModuleImportError` when the module itself fails (a
    SyntaxError, an ImportError of something it imports, anything its top level raises), its message starting with
    ``where`` (the setting, e.g. ``"custom_envs.Math.env_type='my_envs:MyEnv'"``), with the file and line and the
    error (kept as ``__cause__``). A path that names no module returns quietly: its caller reports the path."""
    module = _module_of(target)
    if not module:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(f"{e.name}.")):
            return  # the path names no module
        raise _module_error(where, module, e) from e
    except RollError:  # roll's own errors (a MissingExtraError's pip command, a ConfigError) already say the fix
        raise
    except Exception as e:  # a user's module may raise anything at import; SyntaxError is an Exception too
        raise _module_error(where, module, e) from e


def _module_error(where: str, module: str, error: Exception) -> ModuleImportError:
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    fix = "install what it imports, or fix the module" if isinstance(error, ImportError) else "fix the module"
    at = _failed_at(error)
    return ModuleImportError(
        f"{where}: its module {module} does not import ({f'{at}: ' if at else ''}{type(error).__name__}: {message}); "
        f"{fix}"
    )


def import_target(target: str, setting: str | None = None) -> Any:
    """The object named by ``"package.module:attr"`` (or ``"package.module.attr"``).

    ``setting`` names the config field ``target`` came from: a module that fails while importing is then a
    :class:`ModuleImportError` naming that field, the file and line, and a path that names no module or an
    attribute the module lacks a ConfigError naming it (without it, the import's own error propagates).
    """
    where = f"{setting}={target!r}" if setting else repr(target)
    if setting:
        import_module_of(target, where)
    if ":" in target:
        module_name, attr = target.split(":", 1)
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{where} is not an import path; use 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
        value: Any = module
        for part in attr.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as e:
        if setting is None:
            raise
        raise ConfigError(
            f"{where} cannot be imported ({type(e).__name__}: {e}); check the 'package.module:name'"
        ) from e
    return value


@dataclass
class _Entry:
    target: Any
    package: str | None
    extra: str | None
    resolved: bool


class Registry(Generic[T]):
    """A registry of ``kind`` (e.g. "strategy") with optional entry-point group for plug-ins."""

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, _Entry] = {}
        self._entry_points_loaded = entry_point_group is None

    def register(
        self,
        name: str,
        target: str | T | None = None,
        *,
        package: str | None = None,
        extra: str | None = None,
    ) -> Any:
        """Register ``target`` (an object or a lazy ``"module:attr"``) under ``name``. Without ``target``, returns a
        decorator. ``package``/``extra`` name the pip extra that provides the target's dependencies."""
        if target is None:

            def decorate(obj: T) -> T:
                self.register(name, obj, package=package, extra=extra)
                return obj

            return decorate
        if name in self._entries:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = _Entry(target, package, extra, resolved=not isinstance(target, str))
        return target

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._entries

    def get(self, name: str, setting: str | None = None) -> T:
        """The implementation registered as ``name``, importing it on first use. A target whose module fails while
        importing (a plug-in's or user's) is a :class:`ModuleImportError` naming ``setting`` (the config field that
        gave ``name``), the target, the file and line; a missing extra is a :class:`MissingExtraError`."""
        if name not in self._entries:
            self._load_entry_points()
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(f"unknown {self.kind} {name!r}; known names: {', '.join(self.names()) or '(none)'}")
        if not entry.resolved:
            entry.target = self._resolve(name, entry, setting)
            entry.resolved = True
        return cast("T", entry.target)

    def _resolve(self, name: str, entry: _Entry, setting: str | None) -> Any:
        if entry.extra is None:  # with an extra, a module it cannot import is the extra missing (below)
            named = f"{setting}={name!r}" if setting else f"{self.kind} {name!r}"
            import_module_of(entry.target, f"{named} ({self.kind} registered as {entry.target!r})")
        try:
            return import_target(entry.target)
        except ModuleNotFoundError as e:
            missing = (e.name or "").split(".")[0]
            if entry.extra and missing and missing != "roll":
                raise MissingExtraError(
                    f"{self.kind} {name!r}", entry.package or "roll", entry.extra, cause=f"no module named {e.name!r}"
                ) from e
            raise

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group or ""):
            if ep.name not in self._entries:
                self._entries[ep.name] = _Entry(ep.value, ep.dist.name if ep.dist else None, None, resolved=False)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={sorted(self._entries)})"
