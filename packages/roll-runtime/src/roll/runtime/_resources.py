"""ResourceManager: which node and which local devices each worker of a role gets.

Global device id ``g`` lives on GPU node ``g // num_gpus_per_node`` as local device ``g % num_gpus_per_node``.
GPUs are reserved once per node with a placement group; actors join it with a token GPU share and see their
devices through ``CUDA_VISIBLE_DEVICES``, so several roles can share devices (colocation) when their
``device_mapping`` overlaps. CPU workers (no ``device_mapping``) are spread round-robin over the nodes.

A worker whose class says it runs one engine over several nodes (:meth:`roll.runtime.Worker.spans_nodes`, e.g. a
vLLM or SGLang strategy worker) may own devices on several nodes: its actor runs on the node of its first device, and
its :class:`Placement` lists every node's share with that node's reservation, where the engine starts its processes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from roll.runtime._planning import NodeShare, plan_devices
from roll.runtime.config import WorkerConfig
from roll.runtime.errors import ConfigError, RpcTimeoutError

logger = logging.getLogger(__name__)

# A role's actors ask for this much GPU from the node's reservation, so many roles can be colocated on one GPU.
GPU_SHARE_PER_ACTOR = 0.01


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    num_cpus: float
    num_gpus: int
    is_head: bool


@dataclass(frozen=True)
class NodeDevices:
    """One node's share of a worker's devices, and the reservation (placement group bundle) holding them there.

    A process of the worker's engine runs on this node by joining ``placement_group`` at ``bundle_index`` with a
    token GPU share (:data:`GPU_SHARE_PER_ACTOR`) and pinning ``local_devices`` itself through
    ``CUDA_VISIBLE_DEVICES`` (with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``), as the worker actors do.
    """

    node_rank: int
    node_id: str
    node_ip: str
    global_devices: tuple[int, ...]
    local_devices: tuple[int, ...]
    placement_group: Any = field(default=None, compare=False, repr=False)
    bundle_index: int = 0


@dataclass(frozen=True)
class Placement:
    """Where one worker runs: its node, its devices (global and node-local) and Ray's scheduling options.

    ``node_rank``/``node_id``/``node_ip``/``local_devices`` describe the node the worker actor runs on (its first
    device's); ``global_devices`` are all its devices; ``nodes`` lists every node's share, the actor's first, so a
    worker spanning nodes has more than one.
    """

    rank: int
    node_rank: int
    node_id: str
    node_ip: str
    global_devices: tuple[int, ...]
    local_devices: tuple[int, ...]
    actor_options: dict[str, Any] = field(compare=False)
    nodes: tuple[NodeDevices, ...] = ()

    @property
    def visible_devices(self) -> str:
        return ",".join(str(d) for d in self.local_devices)

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1


def discover_nodes() -> list[NodeInfo]:
    """Alive Ray nodes, head first, then by IP and id, so node ranks are stable across calls."""
    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        nodes.append(
            NodeInfo(
                node_id=node["NodeID"],
                ip=node.get("NodeManagerAddress", ""),
                num_cpus=float(resources.get("CPU", 0.0)),
                num_gpus=int(resources.get("GPU", 0)),
                is_head=any(key.startswith("node:__internal_head__") for key in resources),
            )
        )
    return sorted(nodes, key=lambda n: (not n.is_head, n.ip, n.node_id))


def cpu_workers_fix(role: str | None = None) -> str:
    """How to run a GPU config on CPU workers: the fix an error about missing GPUs names (for ``role``, or all)."""
    if role is None:
        return "to run on CPU workers, set num_gpus_per_node=0 and each role's device_mapping=null with a world_size"
    return f"to run {role} on CPU workers, set {role}.device_mapping=null and {role}.world_size (its number of workers)"


class ResourceManager:
    """Maps roles to nodes and devices of the connected Ray cluster (call :func:`roll.runtime.init` first)."""

    def __init__(
        self, num_nodes: int | None = None, num_gpus_per_node: int | None = None, reserve_timeout_s: float = 300.0
    ):
        if not ray.is_initialized():
            raise ConfigError("Ray is not initialized: call roll.runtime.init() before creating a ResourceManager")
        self.nodes = discover_nodes()
        if not self.nodes:
            raise ConfigError("the Ray cluster has no alive nodes")
        gpu_nodes = [n for n in self.nodes if n.num_gpus > 0]
        if num_gpus_per_node is None:
            num_gpus_per_node = min((n.num_gpus for n in gpu_nodes), default=0)
        if num_gpus_per_node > 0:
            eligible = [n for n in gpu_nodes if n.num_gpus >= num_gpus_per_node]
            if num_nodes is None:
                num_nodes = len(eligible)
            if num_nodes > len(eligible):
                cpu_only = f" (this Ray cluster has no GPUs: {cpu_workers_fix()})"
                raise ConfigError(
                    f"num_nodes={num_nodes} with num_gpus_per_node={num_gpus_per_node}, but only {len(eligible)} "
                    f"node(s) have that many GPUs ({[n.num_gpus for n in gpu_nodes]}); lower num_nodes or "
                    f"num_gpus_per_node{'' if gpu_nodes else cpu_only}"
                )
            self.gpu_nodes = eligible[:num_nodes]
        else:
            self.gpu_nodes = []
            num_nodes = num_nodes or len(self.nodes)
        self.num_nodes = num_nodes
        self.num_gpus_per_node = num_gpus_per_node
        self.reserve_timeout_s = reserve_timeout_s
        self._groups: dict[int, PlacementGroup] = {}
        self._next_cpu_node = 0

    @property
    def total_devices(self) -> int:
        return len(self.gpu_nodes) * self.num_gpus_per_node

    @property
    def cpu_only(self) -> bool:
        return self.total_devices == 0

    def device_location(self, global_device: int) -> tuple[int, int]:
        """(node rank, local device id) of a global device id."""
        return divmod(global_device, self.num_gpus_per_node)

    def validate(self, config: WorkerConfig, *, spans_nodes: bool = False) -> None:
        """Check that ``config``'s devices exist in this cluster, without reserving or starting anything.

        ``spans_nodes``: the role's worker runs one engine over several nodes (``worker_cls.spans_nodes(config)``).
        """
        if config.device_mapping is not None:
            self._check_mapping(config)
            plan_devices(config, num_gpus_per_node=self.num_gpus_per_node, spans_nodes=spans_nodes)

    def allocate(self, config: WorkerConfig, *, spans_nodes: bool = False) -> list[Placement]:
        """One Placement per rank of the role described by ``config`` (``spans_nodes`` as in :meth:`validate`)."""
        if config.device_mapping is None:
            return [self._cpu_placement(rank, config) for rank in range(config.world_size or 1)]
        self._check_mapping(config)
        plans = plan_devices(config, num_gpus_per_node=self.num_gpus_per_node, spans_nodes=spans_nodes)
        return [self._gpu_placement(rank, shares) for rank, shares in enumerate(plans)]

    def _check_mapping(self, config: WorkerConfig) -> None:
        mapping = config.device_mapping or []
        if self.cpu_only:
            raise ConfigError(
                f"{config.name}.device_mapping is set but this Ray cluster has no GPUs: {cpu_workers_fix(config.name)}"
            )
        beyond = [d for d in mapping if d >= self.total_devices]
        if beyond:
            raise ConfigError(
                f"{config.name}.device_mapping uses device ids {beyond}, but the Ray cluster has {self.total_devices} "
                f"devices ({len(self.gpu_nodes)} node(s) x {self.num_gpus_per_node} GPUs, ids 0..{self.total_devices - 1}); "
                f"use ids below {self.total_devices}"
            )

    def _gpu_placement(self, rank: int, shares: tuple[NodeShare, ...]) -> Placement:
        # Every node of the rank is reserved now: the engine's processes on the other nodes join those reservations.
        nodes = tuple(
            NodeDevices(
                share.node_rank,
                self.gpu_nodes[share.node_rank].node_id,
                self.gpu_nodes[share.node_rank].ip,
                share.global_devices,
                share.local_devices,
                self._node_group(share.node_rank),
            )
            for share in shares
        )
        first = nodes[0]
        options = {
            "num_cpus": 0,
            "num_gpus": GPU_SHARE_PER_ACTOR,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=first.placement_group, placement_group_bundle_index=first.bundle_index
            ),
        }
        devices = tuple(d for node in nodes for d in node.global_devices)
        return Placement(
            rank, first.node_rank, first.node_id, first.node_ip, devices, first.local_devices, options, nodes
        )

    def _cpu_placement(self, rank: int, config: WorkerConfig) -> Placement:
        node_rank = self._next_cpu_node % len(self.nodes)
        self._next_cpu_node += 1
        node = self.nodes[node_rank]
        options = {
            "num_cpus": config.num_cpus_per_worker,
            "num_gpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False),
        }
        return Placement(rank, node_rank, node.node_id, node.ip, (), (), options)

    def _node_group(self, node_rank: int) -> PlacementGroup:
        reserved = self._groups.get(node_rank)
        if reserved is not None:
            return reserved
        node = self.gpu_nodes[node_rank]
        group: PlacementGroup = placement_group(
            [{"GPU": float(self.num_gpus_per_node)}],
            strategy="STRICT_PACK",
            _soft_target_node_id=node.node_id,
        )
        ready, _ = ray.wait([group.ready()], timeout=self.reserve_timeout_s)
        if not ready:
            remove_placement_group(group)
            raise RpcTimeoutError(
                "ResourceManager",
                f"reserve {self.num_gpus_per_node} GPUs on node {node.ip}",
                [node_rank],
                self.reserve_timeout_s,
                "Another job may hold these GPUs; free them or lower num_gpus_per_node.",
            )
        placed_on = ray.util.placement_group_table(group).get("bundles_to_node_id", {}).get(0)
        if placed_on and placed_on != node.node_id:
            remove_placement_group(group)
            raise ConfigError(
                f"the GPUs of node {node.ip} are partly taken by another job; free them or lower num_gpus_per_node"
            )
        self._groups[node_rank] = group
        return group

    def destroy(self) -> None:
        """Release the GPU reservations (actors placed in them must be gone first)."""
        for group in self._groups.values():
            remove_placement_group(group)
        self._groups.clear()
