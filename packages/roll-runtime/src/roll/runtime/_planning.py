"""Which node and which local devices each rank of a role gets: pure arithmetic over a cluster's shape.

Global device id ``g`` is local device ``g % num_gpus_per_node`` of GPU node ``g // num_gpus_per_node``. A rank's
devices normally sit on one node. A worker whose backend runs one engine over several nodes (it says so through
:meth:`roll.runtime.Worker.spans_nodes`) may own devices on several nodes: the worker actor runs on the node of its
first device and the engine's processes on the others. No Ray here, so ``roll validate`` and tests plan a cluster that
is only described (``num_nodes`` x ``num_gpus_per_node``).
"""

from __future__ import annotations

from dataclasses import dataclass

from roll.runtime.config import WorkerConfig
from roll.runtime.errors import ConfigError

__all__ = ["NodeShare", "plan_devices"]


@dataclass(frozen=True)
class NodeShare:
    """The part of one rank's devices that sits on one node."""

    node_rank: int
    global_devices: tuple[int, ...]
    local_devices: tuple[int, ...]


def plan_devices(
    config: WorkerConfig, *, num_gpus_per_node: int, spans_nodes: bool = False
) -> list[tuple[NodeShare, ...]]:
    """Per rank of ``config``, its devices grouped by node; the first share is the node the worker actor runs on.

    ``spans_nodes``: the role's worker class runs one engine over several nodes, so a rank may own devices on more
    than one. Otherwise a rank whose devices sit on several nodes is a :class:`ConfigError` naming the fix. Device ids
    beyond the cluster are the caller's to check (its message knows where the cluster's size came from).
    """
    if num_gpus_per_node < 1:
        raise ConfigError(f"num_gpus_per_node must be >= 1 to place {config.name}'s devices, got {num_gpus_per_node}")
    plans: list[tuple[NodeShare, ...]] = []
    for rank in range(config.world_size or 1):
        devices = config.devices_of(rank)
        by_node: dict[int, list[int]] = {}
        for device in devices:  # dict order: nodes in the order their first device appears
            by_node.setdefault(device // num_gpus_per_node, []).append(device)
        if len(by_node) > 1 and not spans_nodes:
            raise ConfigError(
                f"{config.name} rank {rank} would span nodes {sorted(by_node)} with devices {devices}, but its worker "
                f"runs all its devices on one node: give each worker at most {num_gpus_per_node} devices that sit on "
                f"one node (num_gpus_per_worker={config.num_gpus_per_worker}, set by the backend's parallel sizes), "
                f"or use a backend that runs one engine over several nodes"
            )
        plans.append(
            tuple(
                NodeShare(node, tuple(ids), tuple(d % num_gpus_per_node for d in ids)) for node, ids in by_node.items()
            )
        )
    return plans
