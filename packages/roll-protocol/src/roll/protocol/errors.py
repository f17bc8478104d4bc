"""The root of roll's error hierarchy.

Every error roll raises on purpose derives from :class:`RollError`, so applications can catch roll's
failures in one place. Lower layers define the base; upper layers (``roll.runtime``, ...) add their own.

Errors cross process boundaries (a worker's error is pickled by Ray and raised again on the driver), so every
``RollError`` pickles to an equal error whatever its ``__init__`` takes: its message (``args``) and its fields
(``__dict__``) travel as they are, and unpickling does not call ``__init__`` again.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, ClassVar

__all__ = ["MissingExtraError", "ProtocolError", "RollError", "import_extra"]


def _rebuild(cls: type[RollError], args: tuple[Any, ...], state: dict[str, Any]) -> RollError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class RollError(Exception):
    """Base class of every error raised by roll on purpose.

    ``exit_code`` is what the ``roll`` command exits with when this error ends a run: 1 for failures while
    running, 2 for problems the user fixes in the config or environment (see the subclasses that set it).
    """

    exit_code: ClassVar[int] = 1

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class ProtocolError(RollError):
    """A DataProto or dispatch contract was violated (mismatched lengths, conflicting keys, ...)."""


class MissingExtraError(RollError, ImportError):
    """An optional dependency was needed but is not installed.

    The message carries the exact ``pip install`` command that adds it (also in ``pip_command``).
    """

    exit_code: ClassVar[int] = 2

    def __init__(
        self, feature: str, package: str, extra: str, *, cause: str | None = None, note: str | None = None
    ) -> None:
        self.feature = feature
        self.package = package
        self.extra = extra
        self.cause = cause
        self.pip_command = f"pip install '{package}[{extra}]'"
        detail = f" ({cause})" if cause else ""
        after = f" ({note})" if note else ""
        super().__init__(
            f"{feature} needs an optional dependency that is not installed{detail}. "
            f"Install it with: {self.pip_command}{after}"
        )


def import_extra(module: str, feature: str, package: str, extra: str, *, note: str | None = None) -> ModuleType:
    """``module`` imported, or :class:`MissingExtraError` saying that ``feature`` needs ``package[extra]`` (with the
    pip command, and ``note`` after it) when it, or a module it imports, is not installed. An installed module that
    fails otherwise raises as it is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise MissingExtraError(feature, package, extra, cause=str(e), note=note) from e
