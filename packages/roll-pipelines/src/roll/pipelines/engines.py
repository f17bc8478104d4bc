"""EnginePool: independent inference engines fed one call of requests at a time, surviving engine death.

Each engine is a one-rank cluster of the inference role (``<role>-e<i>g<restart>``), so one engine can be
replaced without touching the others. The pool keeps at most one call in flight per engine, with a deadline:

* an engine whose call fails because its actor died (SIGKILL, OOM) is **lost**;
* an engine whose call is still running at its deadline (``request_timeout_s``) is **hung**, and is killed.

Either way the pool starts a fresh actor under a new name, loads the current weights into it (the object-store
buckets of the last sync, kept for that), and hands the requests that engine owned back to the caller through
:meth:`poll` (``lost``), which re-issues exactly those. Each recovery logs a warning and counts in
:meth:`metrics`; more than ``max_restarts`` recoveries in a run is an error.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from roll.protocol import DataProto
from roll.runtime import Cluster, RollError, RpcTimeoutError, WorkerLostError
from roll.strategies import GenerationConfig
from roll.strategies.requests import GenerateRequest, GenerateResult

__all__ = ["EngineFailure", "EnginePool", "PollResult"]

logger = logging.getLogger(__name__)


@dataclass
class _Engine:
    index: int
    cluster: Cluster
    restarts: int = 0
    call: Any = None  # the ObjectRef of the call in flight
    requests: list[GenerateRequest] = field(default_factory=list)
    deadline: float = 0.0


@dataclass(frozen=True)
class EngineFailure:
    """One recovery: which engine, why, and how many requests it owned."""

    engine: int
    reason: str
    requests: int


@dataclass
class PollResult:
    results: list[GenerateResult] = field(default_factory=list)
    lost: list[GenerateRequest] = field(default_factory=list)
    """Requests of engines that died or hung; the caller re-issues them."""
    failures: list[EngineFailure] = field(default_factory=list)


class EnginePool:
    """``count`` engines made by ``make_engine(name)`` (created and initialized, one rank each)."""

    def __init__(
        self,
        make_engine: Callable[[str], Cluster],
        name: str,
        count: int,
        *,
        request_timeout_s: float,
        max_restarts: int,
    ) -> None:
        self.make_engine = make_engine
        self.name = name
        self.request_timeout_s = request_timeout_s
        self.max_restarts = max_restarts
        self.version = 0
        # The sync plan and object-store buckets of the current version (None: the initial model).
        self.weights: tuple[Any, list[Any]] | None = None
        self.restarts = 0
        self.failures: list[EngineFailure] = []
        self.calls = 0
        self.engines = [_Engine(i, make_engine(f"{name}-e{i}g0")) for i in range(count)]

    # --- requests ------------------------------------------------------------------------------------------
    def idle(self) -> list[int]:
        return [e.index for e in self.engines if e.call is None]

    @property
    def in_flight(self) -> int:
        return sum(e.call is not None for e in self.engines)

    def submit(self, engine: int, requests: Sequence[GenerateRequest]) -> None:
        target = self.engines[engine]
        if target.call is not None:
            raise RollError(f"{self.name} engine {engine} already has a call in flight")
        target.requests = list(requests)
        target.call = target.cluster.execute_rank_zero(
            "generate_requests", target.requests, self.version, blocking=False
        )
        target.deadline = time.monotonic() + self.request_timeout_s
        self.calls += 1

    def poll(self, timeout_s: float) -> PollResult:
        """Results of the calls that finished within ``timeout_s``; recovers dead and hung engines."""
        out = PollResult()
        busy = {e.call: e for e in self.engines if e.call is not None}
        if not busy:
            return out
        wait_s = max(0.0, min(timeout_s, min(e.deadline for e in busy.values()) - time.monotonic()))
        ready, _ = ray.wait(list(busy), num_returns=len(busy), timeout=wait_s, fetch_local=False)
        for ref in ready:
            engine = busy.pop(ref)
            try:
                results = ray.get(ref, timeout=0)
            except (RayActorError, GetTimeoutError) as e:
                self._recover(engine, f"died ({type(e).__name__})", out)
                continue
            except RayTaskError as e:
                if isinstance(getattr(e, "cause", None), RayActorError):
                    self._recover(engine, "died", out)
                    continue
                raise
            except RayError as e:
                self._recover(engine, f"lost ({type(e).__name__})", out)
                continue
            engine.call, engine.requests = None, []
            out.results.extend(results)
        now = time.monotonic()
        for engine in busy.values():
            if now >= engine.deadline:
                self._recover(engine, f"hung (no answer within request_timeout_s={self.request_timeout_s:g})", out)
        return out

    # --- recovery ------------------------------------------------------------------------------------------
    def _recover(self, engine: _Engine, reason: str, out: PollResult) -> None:
        owned, engine.requests, engine.call = engine.requests, [], None
        failure = EngineFailure(engine.index, reason, len(owned))
        self.failures.append(failure)
        out.failures.append(failure)
        out.lost.extend(owned)
        self.restarts += 1
        logger.warning(
            "%s engine %d %s; restarting it (restart %d of at most %d) and re-issuing its %d requests",
            self.name,
            engine.index,
            reason,
            self.restarts,
            self.max_restarts,
            len(owned),
        )
        if self.restarts > self.max_restarts:
            raise WorkerLostError(
                self.name, engine.index, "generate_requests", f"{reason}; more than max_restarts={self.max_restarts}"
            )
        engine.cluster.shutdown()
        engine.restarts += 1
        engine.cluster = self.make_engine(f"{self.name}-e{engine.index}g{engine.restarts}")
        if self.weights is not None:
            self._load(engine.cluster, self.weights)

    @staticmethod
    def _load(cluster: Cluster, weights: tuple[Any, list[Any]]) -> None:
        plan, refs = weights
        cluster.load_weight_buckets(plan, refs)
        cluster.process_weights_after_loading()

    # --- weights -------------------------------------------------------------------------------------------
    def sync(self, trainer: Cluster, bucket_bytes: int) -> dict[str, float]:
        """Copy ``trainer``'s weights into every engine (no call may be in flight): the pool's version + 1."""
        if self.in_flight:
            raise RollError(f"{self.name}: drain the engines before a weight sync ({self.in_flight} calls in flight)")
        start = time.perf_counter()
        leader = trainer.export_weight_buckets(bucket_bytes)[0]  # rank 0 holds the plan and every bucket's ref
        plan, refs = self.weights = (leader["plan"], leader["refs"])
        pending = [(e, e.cluster.load_weight_buckets(plan, refs, blocking=False)) for e in self.engines]
        for engine, call in pending:
            try:
                call.materialize()
                engine.cluster.process_weights_after_loading()
            except (WorkerLostError, RpcTimeoutError) as e:
                self._recover(engine, f"lost during the weight sync ({type(e).__name__})", PollResult())
        self.version += 1
        return {"weight_sync/seconds": time.perf_counter() - start, "weight_sync/version": float(self.version)}

    # --- batch calls (validation) --------------------------------------------------------------------------
    def generate(self, prompts: DataProto, generation_config: GenerationConfig) -> DataProto:
        """A whole batch on the first idle engine (validation); the pool must be drained."""
        for attempt in itertools.count():
            engine = self.engines[attempt % len(self.engines)]
            try:
                return engine.cluster.generate(prompts, generation_config)
            except (WorkerLostError, RpcTimeoutError) as e:
                self._recover(engine, f"failed a batch call ({type(e).__name__})", PollResult())
        raise AssertionError("unreachable")

    def metrics(self) -> dict[str, float]:
        return {
            "engines/restarts": float(self.restarts),
            "engines/calls": float(self.calls),
            "engines/version": float(self.version),
        }

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.cluster.shutdown()
