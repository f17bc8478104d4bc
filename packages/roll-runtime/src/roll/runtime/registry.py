"""Name -> implementation registries, resolved lazily.

Strategies, reward workers and environments are registered by name with a ``"module:attr"`` target, so
registering a backend never imports its heavy library; only looking it up does. Third-party packages add
entries through an entry-point group. Unknown names list the known ones; a backend whose optional
dependency is missing raises :class:`MissingExtraError` carrying the exact ``pip install`` command.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, cast

from roll.runtime.errors import ConfigError, MissingExtraError

T = TypeVar("T")

__all__ = ["Registry", "import_target"]


def import_target(target: str, setting: str | None = None) -> Any:
    """The object named by ``"package.module:attr"`` (or ``"package.module.attr"``).

    ``setting`` names the config field ``target`` came from: a module that does not import or an attribute it lacks
    is then a ConfigError naming that field (without it, the import's own error propagates).
    """
    where = f"{setting}={target!r}" if setting else repr(target)
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

    def get(self, name: str) -> T:
        """The implementation registered as ``name``, importing it on first use."""
        if name not in self._entries:
            self._load_entry_points()
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(f"unknown {self.kind} {name!r}; known names: {', '.join(self.names()) or '(none)'}")
        if not entry.resolved:
            entry.target = self._resolve(name, entry)
            entry.resolved = True
        return cast("T", entry.target)

    def _resolve(self, name: str, entry: _Entry) -> Any:
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
