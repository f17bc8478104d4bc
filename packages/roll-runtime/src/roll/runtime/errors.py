"""roll's error types above the protocol layer.

``RollError`` and ``ProtocolError`` live in ``roll.protocol`` (the lowest layer) and are re-exported here so
applications can import the whole hierarchy from one place.
"""

from __future__ import annotations

from roll.protocol.errors import ProtocolError, RollError

__all__ = [
    "ConfigError",
    "MissingExtraError",
    "ProtocolError",
    "RollError",
    "RpcTimeoutError",
    "WorkerError",
    "WorkerLostError",
]


class ConfigError(RollError, ValueError):
    """A configuration value is invalid. The message names the field, the bad value and how to fix it."""


class MissingExtraError(RollError, ImportError):
    """An optional backend was selected but its library is not installed.

    The message carries the exact ``pip install`` command that adds it.
    """

    def __init__(self, feature: str, package: str, extra: str, *, cause: str | None = None) -> None:
        self.feature = feature
        self.pip_command = f"pip install '{package}[{extra}]'"
        detail = f" ({cause})" if cause else ""
        super().__init__(
            f"{feature} needs an optional dependency that is not installed{detail}. Install it with: {self.pip_command}"
        )


class WorkerError(RollError):
    """A registered method raised inside a worker. Names the cluster, rank and method, and carries the remote traceback."""

    def __init__(self, cluster: str, rank: int, method: str, remote_traceback: str) -> None:
        self.cluster = cluster
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback
        super().__init__(f"{cluster} rank {rank} failed in {method}():\n{remote_traceback}")


class WorkerLostError(WorkerError):
    """A worker's actor died (killed, out of memory, node lost) while a call was pending or before it was made."""

    def __init__(self, cluster: str, rank: int, method: str, reason: str) -> None:
        super().__init__(cluster, rank, method, reason)
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
        advice = hint or "raise rpc_timeout_s in the role's config if the work is legitimately slow"
        super().__init__(
            f"{cluster}.{method}() did not finish within {timeout_s:g} s; ranks still running: {pending_ranks}. {advice}"
        )
