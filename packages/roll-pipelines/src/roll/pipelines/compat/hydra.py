"""Hydra-style composition of a YAML file: ``defaults:`` lists, ``${...}`` interpolation, the ``hydra:`` section.

ROLL's configs are Hydra primary configs. This module reads them without Hydra or OmegaConf:

* ``defaults:`` entries name other YAML files relative to the file (``../config/envs@_here_``, ``base``,
  ``{group: option}`` for ``group/option.yaml``); each is merged at the root (``@_here_``, ``@_global_`` or a plain
  name) or under its group / the ``@package`` given. ``_self_`` places the file's own keys; without it they come last.
* ``${a.b}`` refers to another key (the whole value keeps its type; inside a string it is formatted),
  ``${oc.env:NAME,default}`` to an environment variable and ``${now:%Y%m%d}`` to the current time.
* ``hydra:`` (Hydra's own run settings) is removed.

A missing file, a missing key or a reference cycle is one :class:`ConfigError` naming the file or key.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from roll.runtime import ConfigError

__all__ = ["compose_file", "deep_merge", "interpolate", "referenced_keys"]

_REF = re.compile(r"\$\{([^${}]+)\}")
_MAX_DEPTH = 16


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into a copy of ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping of config fields, got {type(data).__name__}")
    return data


def _default_target(entry: Any, where: Path) -> tuple[str, str | None] | None:
    """(relative file name without .yaml, package key or None for the root) of one ``defaults`` entry."""
    if entry == "_self_":
        return None
    if isinstance(entry, str):
        name, _, package = entry.partition("@")
        return name, None if package in ("", "_here_", "_global_") else package
    if isinstance(entry, dict) and len(entry) == 1:
        group, option = next(iter(entry.items()))
        group_name, _, package = str(group).partition("@")
        if option is None:
            return None  # `- group: null` removes a group Hydra-side; nothing to load
        key = package if package else group_name.rsplit("/", 1)[-1]
        return f"{group_name}/{option}", None if key in ("_here_", "_global_") else key
    raise ConfigError(
        f"{where}: defaults entry {entry!r} is not understood; use 'file', 'file@_here_' or {{group: file}}"
    )


def _compose(path: Path, depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise ConfigError(f"{path}: defaults nest deeper than {_MAX_DEPTH} files (a cycle?)")
    own = _read_mapping(path)
    own.pop("hydra", None)
    defaults = own.pop("defaults", None)
    if defaults is None:
        return own
    if not isinstance(defaults, list):
        raise ConfigError(f"{path}: defaults must be a list, got {type(defaults).__name__}")
    merged: dict[str, Any] = {}
    self_placed = False
    for entry in defaults:
        if entry == "_self_":
            merged, self_placed = deep_merge(merged, own), True
            continue
        target = _default_target(entry, path)
        if target is None:
            continue
        name, package = target
        child_path = (path.parent / name).with_suffix(".yaml") if not name.endswith(".yaml") else path.parent / name
        if not child_path.is_file():
            raise ConfigError(f"{path}: defaults entry {entry!r} names {child_path}, which does not exist")
        child = _compose(child_path, depth + 1)
        merged = deep_merge(merged, {package: child} if package else child)
    return merged if self_placed else deep_merge(merged, own)


def _lookup(root: dict[str, Any], dotted: str, key: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConfigError(f"{key}: interpolation ${{{dotted}}} refers to a key that does not exist")
    return node


def _resolver(expr: str, key: str) -> Any | None:
    """The value of a resolver call (``oc.env:NAME,default``, ``now:fmt``), or None if ``expr`` is a key path."""
    name, sep, args = expr.partition(":")
    if not sep:
        return None
    if name in ("oc.env", "env"):
        var, _, default = args.partition(",")
        value = os.environ.get(var.strip())
        if value is None and not _:
            raise ConfigError(f"{key}: ${{{expr}}}: environment variable {var.strip()} is not set and has no default")
        return value if value is not None else yaml.safe_load(default.strip()) if default.strip() else ""
    if name == "now":
        return datetime.datetime.now().strftime(args)
    raise ConfigError(f"{key}: ${{{expr}}} uses resolver {name!r}; roll knows oc.env and now")


def _resolve_value(root: dict[str, Any], value: Any, key: str, stack: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _resolve_value(root, v, f"{key}.{k}" if key else str(k), stack) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_value(root, v, f"{key}[{i}]", stack) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def resolve(expr: str) -> Any:
        expr = expr.strip()
        from_resolver = _resolver(expr, key)
        if from_resolver is not None:
            return from_resolver
        if expr in stack:
            raise ConfigError(f"{key}: interpolation cycle {' -> '.join((*stack, expr))}")
        return _resolve_value(root, _lookup(root, expr, key), expr, (*stack, expr))

    whole = _REF.fullmatch(value)
    if whole:
        return resolve(whole.group(1))
    return _REF.sub(lambda m: str(resolve(m.group(1))), value)


def interpolate(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with every ``${...}`` resolved against ``data`` itself (absolute key paths)."""
    resolved: dict[str, Any] = _resolve_value(data, data, "", ())
    return resolved


def referenced_keys(data: Any) -> set[str]:
    """Top-level keys that some ``${...}`` in ``data`` refers to (before interpolation)."""
    found: set[str] = set()
    if isinstance(data, dict):
        for value in data.values():
            found |= referenced_keys(value)
    elif isinstance(data, list):
        for value in data:
            found |= referenced_keys(value)
    elif isinstance(data, str):
        found |= {m.group(1).strip().split(".")[0] for m in _REF.finditer(data) if ":" not in m.group(1)}
    return found


def compose_file(
    path: str | Path, edit: Callable[[dict[str, Any]], None] | None = None
) -> tuple[dict[str, Any], set[str]]:
    """The composed, interpolated mapping of ``path`` and the top-level keys its interpolations referred to.

    ``edit`` changes the composed mapping before its ``${...}`` are resolved (where Hydra applies command-line
    overrides, so an override of an interpolated value reaches every key that refers to it)."""
    composed = _compose(Path(path), 0)
    if edit is not None:
        edit(composed)
    return interpolate(composed), referenced_keys(composed)
