"""Waiting for remote calls: every wait has a deadline, and failures name the worker that failed.

Waits are fail-fast: if one rank raises while others are still running (perhaps blocked in a collective
that will never complete), the error surfaces at once instead of after the timeout.

The public ways to wait for non-blocking calls: :meth:`PendingCall.materialize` (one call), :func:`materialize_all`
(several calls that depend on each other) and :func:`materialize_concat` (DataProto results of calls or of plain
Ray ObjectRefs, concatenated in order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray import ObjectRef
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from roll.protocol import DataProto
from roll.runtime.errors import ProtocolError, RpcTimeoutError, WorkerError, WorkerLostError

__all__ = ["PendingCall", "materialize_all", "materialize_concat", "wait_all"]

# While waiting, ranks that already finished are checked for errors at least this often.
_POLL_S = 1.0


Label = tuple[str, int, str]  # (cluster, rank, method) of one pending ref


def _translate(error: BaseException, cluster: str, rank: int, method: str) -> Exception:
    if isinstance(error, RayTaskError):
        cause = getattr(error, "cause", None)
        if isinstance(cause, RayActorError):
            return WorkerLostError(cluster, rank, method, str(cause).strip().splitlines()[0])
        if isinstance(cause, WorkerError):
            # A worker that itself called a cluster: keep the inner, more precise error.
            return cause
        # The worker's own error (unpickled intact: roll errors pickle with their fields) rides along as the
        # cause, so callers can show its message and hint rather than Ray's wrapper around it.
        return WorkerError(cluster, rank, method, str(error), cause=cause if isinstance(cause, Exception) else None)
    if isinstance(error, RayError):
        # Actor death, an unschedulable actor, a lost object: the worker cannot deliver a result.
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return WorkerLostError(cluster, rank, method, reason)
    return WorkerError(cluster, rank, method, f"{type(error).__name__}: {error}")


def _get_one(ref: ObjectRef[Any], cluster: str, rank: int, method: str) -> Any:
    try:
        return ray.get(ref)
    except RayError as e:
        raise _translate(e, cluster, rank, method) from None


def wait_all(
    refs: Sequence[ObjectRef[Any]],
    ranks: Sequence[int],
    *,
    cluster: str,
    method: str,
    timeout_s: float | None,
) -> list[Any]:
    """Results of ``refs`` (one per rank in ``ranks``), raising WorkerError / WorkerLostError / RpcTimeoutError."""
    return _wait_labeled(refs, [(cluster, rank, method) for rank in ranks], timeout_s)


def _wait_labeled(refs: Sequence[ObjectRef[Any]], labels: Sequence[Label], timeout_s: float | None) -> list[Any]:
    if not refs:
        return []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    index_of = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        wait_s = _POLL_S if remaining is None else min(_POLL_S, remaining)
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s, fetch_local=False)
        if pending:
            # Some ranks finished, others did not: surface a finished rank's failure right away.
            for ref in ready:
                _raise_if_failed(ref, *labels[index_of[ref]])
        if pending and remaining is not None and remaining <= wait_s:
            cluster, _, method = labels[index_of[pending[0]]]
            stuck = sorted(labels[index_of[r]][1] for r in pending if labels[index_of[r]][0] == cluster)
            raise RpcTimeoutError(cluster, method, stuck, timeout_s or 0.0)
    try:
        return list(ray.get(list(refs)))
    except GetTimeoutError:  # pragma: no cover - every ref is ready here
        cluster, _, method = labels[0]
        raise RpcTimeoutError(cluster, method, [label[1] for label in labels], timeout_s or 0.0) from None
    except RayError:
        # Find the (first) failing rank to name it.
        return [_get_one(ref, *label) for ref, label in zip(refs, labels)]


def _raise_if_failed(ref: ObjectRef[Any], cluster: str, rank: int, method: str) -> None:
    try:
        ray.get(ref, timeout=0)
    except GetTimeoutError:
        return
    except RayError as e:
        raise _translate(e, cluster, rank, method) from None


class PendingCall(list[ObjectRef[Any]]):
    """The result of a non-blocking cluster call: a list of the ObjectRefs whose results count (in order).

    ``ray.get(pending)`` works as with plain refs. :meth:`materialize` waits for every rank, with the role's timeout
    and named errors, and applies the dispatch mode's collection.
    """

    def __init__(
        self,
        collected_refs: list[ObjectRef[Any]],
        all_refs: list[ObjectRef[Any]],
        ranks: list[int],
        collect: Callable[[list[Any]], Any],
        *,
        cluster: str,
        method: str,
        timeout_s: float | None,
        owner: object = None,
    ) -> None:
        super().__init__(collected_refs)
        self._owner = owner  # the cluster: dropping it while this call runs would kill its workers
        self.all_refs = all_refs
        self.ranks = ranks
        self.cluster = cluster
        self.method = method
        self.timeout_s = timeout_s
        self._collect = collect

    def materialize(self, timeout: float | None = None) -> Any:
        """Wait for every rank (``timeout`` seconds, default the role's ``rpc_timeout_s``) and return the collected
        result, as the blocking call would have."""
        timeout_s = self.timeout_s if timeout is None else timeout
        outputs = wait_all(self.all_refs, self.ranks, cluster=self.cluster, method=self.method, timeout_s=timeout_s)
        return self._collect(outputs)

    def get(self, timeout: float | None = None) -> Any:
        """Alias of :meth:`materialize`."""
        return self.materialize(timeout)

    def collect(self, outputs: list[Any]) -> Any:
        """The collected result from every rank's output (in the order of ``all_refs``)."""
        return self._collect(outputs)


def materialize_all(*calls: PendingCall, timeout: float | None = None) -> list[Any]:
    """Wait for several non-blocking calls together (possibly on different clusters), failing fast on the first
    error from any of them, and return each call's collected result.

    Use it when calls depend on each other (a weight sender and its receivers): waiting for one call after
    another would let a failure on the second side hide behind a hang on the first.
    """
    refs: list[ObjectRef[Any]] = []
    labels: list[Label] = []
    for call in calls:
        refs.extend(call.all_refs)
        labels.extend((call.cluster, rank, call.method) for rank in call.ranks)
    timeouts = [call.timeout_s for call in calls if call.timeout_s is not None]
    limit = timeout if timeout is not None else (max(timeouts) if timeouts else None)
    outputs = _wait_labeled(refs, labels, limit)
    results, start = [], 0
    for call in calls:
        results.append(call.collect(outputs[start : start + len(call.all_refs)]))
        start += len(call.all_refs)
    return results


def _resolve(results: Any, timeout: float | None) -> list[Any]:
    """The values behind ``results``, flattened in order: a PendingCall gives its collected result (a list's items,
    else the value), a Ray ObjectRef its value, and a list or tuple of these each of its items' values. Anything
    else is already a value."""
    if isinstance(results, PendingCall):
        value = results.materialize(timeout)
        return list(value) if isinstance(value, list) else [value]
    if isinstance(results, ObjectRef):
        return _resolve([ray.get(results, timeout=timeout)], timeout)
    if not isinstance(results, (list, tuple)):
        return [results]
    items = list(results)
    refs = [i for i, item in enumerate(items) if isinstance(item, ObjectRef)]
    if refs:
        values = ray.get([items[i] for i in refs], timeout=timeout)
        for i, value in zip(refs, values):
            items[i] = value
    out: list[Any] = []
    for item in items:
        out.extend(_resolve(item, timeout) if isinstance(item, (PendingCall, list, tuple)) else [item])
    return out


def materialize_concat(results: Any, timeout: float | None = None) -> DataProto:
    """Wait for DataProto results and concatenate them in order.

    ``results``: what a non-blocking call returned (``cluster.generate(batch, blocking=False)``), Ray ObjectRefs of
    DataProtos, DataProtos, or a list mixing these. Calls wait with their role's timeout unless ``timeout`` is
    given, and a worker's failure raises an error that names the worker.
    """
    values = _resolve(results, timeout)
    if not values or not all(isinstance(v, DataProto) for v in values):
        kinds = sorted({type(v).__name__ for v in values}) or ["nothing"]
        raise ProtocolError(f"materialize_concat() expects DataProto results, got {', '.join(kinds)}")
    return values[0] if len(values) == 1 else DataProto.concat(values)
