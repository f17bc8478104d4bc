"""The launch plan of a vLLM engine that spans nodes (pure: no vLLM, no Ray calls, tested on any machine).

A rank that owns devices on several nodes (``worker.nodes``, see :class:`roll.runtime.NodeDevices`) runs one vLLM
engine whose tensor x pipeline parallel ranks are Ray actors, one per device: vLLM's multi-node mode with the Ray
distributed executor. roll's executor (``_ray_executor``) places engine rank ``r`` on the node and local device the
plan names, inside that node's reservation; the worker actor itself keeps the engine core (scheduler) on the first
node. Engine ranks follow the worker's device order (the first node's devices first), so a tensor-parallel group
stays on one node whenever the node holds a multiple of ``tensor_parallel_size`` devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from roll.strategies.contract import StrategyError
from roll.strategies.vllm.config import VllmConfig

__all__ = ["EngineRank", "engine_ranks", "multi_node_engine_kwargs"]

# What ``engine_kwargs.distributed_executor_backend`` may say for a rank spanning nodes: Ray is the only executor
# vLLM runs over nodes, and roll's Ray executor is the one that knows the reservations.
_RAY_BACKENDS = (None, "ray")


@dataclass(frozen=True)
class EngineRank:
    """Where one tensor/pipeline-parallel rank of the engine runs."""

    rank: int
    tp_rank: int
    pp_rank: int
    node_index: int  # index into the worker's ``nodes`` (0: the worker's own node)
    node_ip: str
    local_device: int  # node-local device id, made the process's only visible device
    placement_group: Any  # the node's reservation; the process joins its bundle with a token GPU share
    bundle_index: int


def engine_ranks(config: VllmConfig, nodes: Sequence[Any]) -> list[EngineRank]:
    """One :class:`EngineRank` per device of the worker (``nodes``: its NodeDevices, the worker's node first)."""
    devices = [(index, node, local) for index, node in enumerate(nodes) for local in node.local_devices]
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if len(devices) != tp * pp:
        raise StrategyError(
            f"the worker owns {len(devices)} devices over {len(nodes)} node(s) but its engine has tensor_parallel_size"
            f" x pipeline_parallel_size = {tp} x {pp} = {tp * pp}; make device_mapping give each worker {tp * pp}"
        )
    return [
        EngineRank(
            rank=rank,
            tp_rank=rank % tp,
            pp_rank=rank // tp,
            node_index=index,
            node_ip=node.node_ip,
            local_device=local,
            placement_group=node.placement_group,
            bundle_index=node.bundle_index,
        )
        for rank, (index, node, local) in enumerate(devices)
    ]


def multi_node_engine_kwargs(config: VllmConfig, executor: Any) -> dict[str, Any]:
    """What a spanning rank's engine arguments change: Ray's distributed executor (roll's, given as ``executor``).

    Raises StrategyError if ``engine_kwargs`` asks for an executor that cannot span nodes.
    """
    asked = config.engine_kwargs.get("distributed_executor_backend")
    if asked not in _RAY_BACKENDS:
        raise StrategyError(
            f"engine_kwargs.distributed_executor_backend={asked!r} cannot run an engine over several nodes; remove "
            f"it or set 'ray' (roll then uses its Ray executor on the worker's reserved devices)"
        )
    if not config.engine_in_process:
        raise StrategyError(
            "a vLLM engine over several nodes runs its engine core in the worker process (in_process: true): roll's "
            "Ray executor is handed to the engine as a class holding the placement of every engine rank"
        )
    return {"distributed_executor_backend": executor}
