"""roll's error types above the protocol layer.

``RollError``, ``ProtocolError`` and ``MissingExtraError`` live in ``roll.protocol`` (the lowest layer) and are
re-exported here so applications can import the whole hierarchy from one place. Every error pickles with its message
and fields (see ``roll.protocol.errors``), so a worker's error reaches the driver intact.
"""

from __future__ import annotations

from typing import ClassVar

from roll.protocol.errors import MissingExtraError, ProtocolError, RollError, import_extra

__all__ = [
    "ConfigError",
    "MissingExtraError",
    "ModuleImportError",
    "ProtocolError",
    "RollError",
    "RpcTimeoutError",
    "WorkerError",
    "WorkerLostError",
    "import_extra",
]


class ConfigError(RollError, ValueError):
    """A configuration value is invalid. The message names the field, the bad value and how to fix it."""

    exit_code: ClassVar[int] = 2


class ModuleImportError(ConfigError):
    """The module of an import path a config names (a user's env, tool, reward...) fails while importing: a
    SyntaxError, an ImportError of what it imports, or anything its top level raises. The message names the setting,
    the file and line; the module's own error is the ``__cause__``."""


class WorkerError(RollError):
    """A registered method raised inside a worker. Names the cluster, rank and method, and carries the remote
    traceback and, when the worker raised a roll error, that error itself as ``cause`` (its own message and hint)."""

    def __init__(
        self, cluster: str, rank: int, method: str, remote_traceback: str, cause: BaseException | None = None
    ) -> None:
        self.cluster = cluster
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback
        self.cause = cause
        super().__init__(f"{cluster} rank {rank} failed in {method}():\n{remote_traceback}")

    @property
    def summary(self) -> str:
        """One line for a console: where it failed and the worker's own message when it raised a roll error."""
        where = f"{self.cluster} rank {self.rank} failed in {self.method}()"
        return f"{where}: {self.cause}" if isinstance(self.cause, RollError) else str(self)


class WorkerLostError(WorkerError):
    """A worker's actor died (killed, out of memory, node lost) while a call was pending or before it was made."""

    def __init__(self, cluster: str, rank: int, method: str, reason: str) -> None:
        super().__init__(cluster, rank, method, reason)
        self.reason = reason
        self.args = (f"{cluster} rank {rank} died during {method}(): {reason}",)


class RpcTimeoutError(RollError, TimeoutError):
    """A call to a cluster did not finish within its timeout. Names the cluster, method and ranks still pending."""

    def __init__(
        self, cluster: str, method: str, pending_ranks: list[int], timeout_s: float, hint: str | None = None
    ) -> None:
        self.cluster = cluster
        self.method = method
        self.pending_ranks = pending_ranks
        self.timeout_s = timeout_s
        self.hint = hint
        advice = hint or "raise rpc_timeout_s in the role's config if the work is legitimately slow"
        super().__init__(
            f"{cluster}.{method}() did not finish within {timeout_s:g} s; ranks still running: {pending_ranks}. {advice}"
        )
