"""ModelUpdateGroup: the driver side of weight sync from a training cluster to inference clusters.

Transports (``transport=``):

* ``"auto"`` (default): by topology. Receivers that can map training rank 0's bucket ring read it in place
  (``/dev/shm`` on the same node; CUDA IPC on the same GPU); the others get each bucket by a gloo/NCCL broadcast.
  If that cannot be set up, the object store is used (with a warning).
* ``"shared_memory"``: every receiver reads the ring in place (an error if one cannot).
* ``"collective"``: every receiver gets buckets by broadcast.
* ``"object_store"``: buckets travel through Ray's object store.

Every sync returns ``weight_sync/*`` metrics: bytes and buckets; sender-side ``gather_s`` (producing full
tensors: collectives, LoRA merges), ``pack_s`` (copying into bucket slots), ``send_wait_s`` (waiting for a free
slot), ``broadcast_s``; receiver-side ``receive_wait_s`` (waiting for buckets), ``load_s`` (the engine's
``update_weights``), ``finalize_s`` (its post-load processing); ``transport_s`` (send start to the last bucket
being readable by the last receiver), ``seconds`` (the whole sync, driver wall clock) and GB/s of both. Per-bucket
timings of the last sync are in :attr:`ModelUpdateGroup.last_buckets`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from roll.runtime import Cluster, ConfigError, RollError, materialize_all
from roll.strategies.weight_sync.routes import TRANSPORTS, Routes, plan_routes

__all__ = ["ModelUpdateGroup"]

logger = logging.getLogger(__name__)


def _merge(results: list[dict[str, Any]]) -> dict[str, float]:
    """The slowest rank's value of every metric (phases run in parallel across ranks)."""
    merged: dict[str, float] = {}
    for metrics in results:
        for key, value in metrics.items():
            if isinstance(value, int | float):
                merged[key] = max(merged.get(key, float("-inf")), float(value))
    return merged


class ModelUpdateGroup:
    """Pushes ``src``'s weights into every worker of ``dst`` every ``frequency`` steps (see the module docstring).

    Both clusters' workers must derive from :class:`roll.strategies.StrategyWorker`. A sync that fails midway
    raises; receivers that loaded part of it refuse to compute until a later sync completes, and the channel is
    rebuilt by the next :meth:`update`.
    """

    def __init__(
        self,
        src: Cluster,
        dst: Cluster,
        *,
        frequency: int = 1,
        bucket_size_mb: float = 256,
        transport: str = "auto",
        timeout_s: float = 600.0,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        if bucket_size_mb <= 0:
            raise ConfigError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
        self.src, self.dst = src, dst
        self.frequency = frequency
        self.bucket_bytes = int(bucket_size_mb * 1024 * 1024)
        self.group = f"model_update/{src.name}->{dst.name}"
        self.requested = transport
        self.transport = transport
        self.timeout_s = timeout_s
        self.routes: Routes | None = None
        self.last_buckets: dict[str, list[list[dict[str, float]]]] = {}
        self._ready = False

    # --- setup ------------------------------------------------------------------------------------------
    def _setup_channel(self, transport: str) -> Routes:
        senders = self.src.weight_sync_endpoint()
        receivers = self.dst.weight_sync_endpoint()
        prepared = self.src.prepare_weight_sender(self.group, self.bucket_bytes)
        plan = prepared[0][0]
        mismatched = [rank for rank, (other, _) in enumerate(prepared) if other.fingerprint != plan.fingerprint]
        if mismatched:
            raise RollError(f"{self.src.name}: ranks {mismatched} list different weights than rank 0")
        routes = plan_routes(
            senders,
            receivers,
            transport,
            writes_shards=all(shards for _, shards in prepared),
            share_keys=self.dst.weight_share_key(),
        )
        spec = self.src.execute_rank_zero("open_weight_channel", self.group, plan, routes, self.timeout_s)
        try:
            sender = self.src.attach_weight_sender(spec, blocking=False, timeout=self.timeout_s)
            receiver = self.dst.attach_weight_receiver(spec, blocking=False, timeout=self.timeout_s)
            materialize_all(sender, receiver)
            self.src.execute_rank_zero("seal_weight_channel", self.group)
        except BaseException:
            self._close_channel(timeout_s=60.0)
            raise
        logger.info("%s: %s; %s", self.group, plan.describe(), routes.describe())
        return routes

    def setup(self) -> None:
        if self._ready:
            return
        # "auto" degrades step by step: mixed routes, then broadcast only (e.g. no shared /dev/shm between
        # containers), then the object store.
        attempts = {"auto": ["auto", "collective"], "object_store": []}.get(self.requested, [self.requested])
        self.transport = "object_store"
        for transport in attempts:
            try:
                self.routes = self._setup_channel(transport)
                self.transport = transport
                break
            except RollError:
                if self.requested != "auto":
                    raise
                logger.warning("%s: weight sync by %r unavailable", self.group, transport, exc_info=True)
        if self.transport == "object_store" and self.requested == "auto":
            logger.warning("%s: using the object store for weight sync", self.group)
        self._ready = True

    # --- sync -------------------------------------------------------------------------------------------
    def update(self, step: int, *, force: bool = False) -> dict[str, Any]:
        """Sync weights if ``step`` is due (or ``force``); returns metrics (empty when skipped)."""
        if not force and step % self.frequency:
            return {}
        self.setup()
        start = time.perf_counter()
        try:
            if self.transport == "object_store":
                sent, received = self._through_object_store()
            else:
                sent_call = self.src.send_weights(self.group, blocking=False)
                received_call = self.dst.receive_weights(self.group, blocking=False)
                # Together: a failure on either side surfaces at once instead of behind the other side's wait.
                sent, received = materialize_all(sent_call, received_call)
        except BaseException:
            self._reset()
            raise
        seconds = time.perf_counter() - start
        return self._metrics(sent, received, seconds)

    def _through_object_store(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        exported = self.src.export_weight_buckets(self.bucket_bytes)
        leader = exported[0]
        received = self.dst.load_weight_buckets(leader["plan"], leader["refs"])
        return [e["metrics"] for e in exported], received

    def _metrics(self, sent: list[dict[str, Any]], received: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        self.last_buckets = {
            "sender": [m.pop("weight_sync/_buckets", []) for m in sent],
            "receiver": [m.pop("weight_sync/_buckets", []) for m in received],
        }
        send_started = min(m["weight_sync/send_started_at"] for m in sent)
        last_byte = max(m["weight_sync/last_byte_at"] for m in received)
        metrics = _merge([{k: v for k, v in m.items() if not k.endswith("_at")} for m in sent + received])
        nbytes = metrics.get("weight_sync/bytes", 0.0)
        metrics["weight_sync/receivers"] = float(len(received))
        metrics["weight_sync/transport_s"] = max(0.0, last_byte - send_started)
        metrics["weight_sync/seconds"] = seconds
        if seconds > 0:
            metrics["weight_sync/gbps"] = nbytes / seconds / 1e9
        if metrics["weight_sync/transport_s"] > 0:
            metrics["weight_sync/transport_gbps"] = nbytes / metrics["weight_sync/transport_s"] / 1e9
        return metrics

    # --- teardown ---------------------------------------------------------------------------------------
    def _close_channel(self, timeout_s: float | None) -> None:
        for cluster in (self.src, self.dst):
            try:
                cluster.close_weight_channel(self.group, timeout=timeout_s)
            except RollError as e:  # a dead or stuck worker: its memory goes with its process
                logger.warning("%s: closing the weight channel on %s failed: %s", self.group, cluster.name, e)

    def _reset(self) -> None:
        """After a failed sync: drop the channel (its counters are out of step); the next update rebuilds it."""
        if self._ready and self.transport != "object_store":
            self._close_channel(timeout_s=min(self.timeout_s, 120.0))
        self._ready = False
        self.transport = self.requested

    def close(self, timeout_s: float | None = None) -> None:
        """Tear down the weight channel on both sides; each call waits at most ``timeout_s`` (the roles' own
        rpc_timeout_s by default): a worker still busy with earlier work only answers once that work is done."""
        if self._ready and self.transport != "object_store":
            self._close_channel(timeout_s)
        self._ready = False
