"""ModelUpdateGroup: the driver side of weight sync from a training cluster to inference clusters."""

from __future__ import annotations

import logging
import time
from typing import Any

from roll.runtime import Cluster, RollError, materialize_all

__all__ = ["ModelUpdateGroup"]

logger = logging.getLogger(__name__)


def _merge(results: list[dict[str, float]]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for metrics in results:
        for key, value in metrics.items():
            merged[key] = max(merged.get(key, 0.0), value)
    return merged


class ModelUpdateGroup:
    """Pushes ``src``'s weights into every worker of ``dst`` every ``frequency`` steps.

    ``transport="collective"`` broadcasts buckets over a dedicated gloo/NCCL group (one send for all engines);
    ``"object_store"`` ships them through Ray; ``"auto"`` tries the collective and falls back if it cannot be set
    up. Both workers must derive from :class:`roll.strategies.StrategyWorker`.
    """

    def __init__(
        self,
        src: Cluster,
        dst: Cluster,
        *,
        frequency: int = 1,
        bucket_size_mb: int = 256,
        transport: str = "auto",
    ) -> None:
        if transport not in ("auto", "collective", "object_store"):
            raise RollError(f"transport must be auto, collective or object_store, got {transport!r}")
        self.src, self.dst = src, dst
        self.frequency = frequency
        self.bucket_bytes = bucket_size_mb * 1024 * 1024
        self.group = f"model_update/{src.name}->{dst.name}"
        self.transport = transport
        self._ready = False

    def _setup_collective(self) -> None:
        address = self.src.execute_rank_zero("_roll_node_address")
        port = self.src.execute_rank_zero("_roll_free_port")
        world = 1 + self.dst.world_size
        sender = self.src.setup_weight_sender(self.group, address, port, world, blocking=False)
        receiver = self.dst.setup_weight_receiver(self.group, address, port, world, 1, blocking=False)
        materialize_all(sender, receiver)

    def setup(self) -> None:
        if self._ready:
            return
        if self.transport in ("auto", "collective"):
            try:
                self._setup_collective()
                self.transport = "collective"
            except RollError:
                if self.transport == "collective":
                    raise
                logger.warning(
                    "%s: collective weight sync unavailable; using the object store", self.group, exc_info=True
                )
                self.transport = "object_store"
        self._ready = True

    def update(self, step: int, *, force: bool = False) -> dict[str, Any]:
        """Sync weights if ``step`` is due (or ``force``); returns metrics (empty when skipped)."""
        if not force and step % self.frequency:
            return {}
        self.setup()
        start = time.perf_counter()
        if self.transport == "collective":
            sent = self.src.send_weights(self.group, self.bucket_bytes, blocking=False)
            received = self.dst.receive_weights(self.group, blocking=False)
            # Together: a receiver that fails must not leave the sender blocked until the group times out.
            sent_metrics, received_metrics = materialize_all(sent, received)
            metrics = _merge(sent_metrics + received_metrics)
        else:
            refs = [ref for per_rank in self.src.export_weight_buckets(self.bucket_bytes) for ref in per_rank]
            metrics = _merge(self.dst.load_weight_buckets(refs))
            metrics["weight_sync/bytes"] = metrics.get("weight_sync/received_bytes", 0.0)
        self.dst.process_weights_after_loading()
        seconds = time.perf_counter() - start
        metrics["weight_sync/seconds"] = seconds
        if seconds > 0:
            metrics["weight_sync/gbps"] = metrics.get("weight_sync/bytes", 0.0) / seconds / 1e9
        return metrics

    def close(self, timeout_s: float | None = None) -> None:
        """Tear down the weight channel on both sides; each call waits at most ``timeout_s`` (the roles' own
        rpc_timeout_s by default): a worker still busy with earlier work only answers once that work is done."""
        if self._ready and self.transport == "collective":
            self.src.close_weight_channel(self.group, timeout=timeout_s)
            self.dst.close_weight_channel(self.group, timeout=timeout_s)
        self._ready = False
