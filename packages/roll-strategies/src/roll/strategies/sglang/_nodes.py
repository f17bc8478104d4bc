"""The launch plan of an SGLang engine that spans nodes (pure: no sglang, no Ray calls, tested on any machine).

SGLang runs one engine over ``nnodes`` nodes by starting the same ``sglang.Engine`` arguments on every node with its
own ``node_rank``; the nodes meet at ``dist_init_addr`` (an address on node 0). A worker the runtime placed over
several nodes (``worker.nodes``, its own node first) keeps node 0's engine in the worker process; on each other node
a small helper actor, placed in that node's reservation and seeing that node's share of the devices, starts the
engine's processes there (``SglangStrategy`` launches them from this plan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roll.strategies.contract import StrategyError
from roll.strategies.sglang.config import SglangConfig

__all__ = ["NodeLaunch", "node_launch_plan"]


@dataclass(frozen=True)
class NodeLaunch:
    """What runs on one node of a multi-node SGLang engine."""

    node_rank: int  # SGLang's node_rank: 0 is the worker's own node
    node_ip: str
    visible_devices: str  # CUDA_VISIBLE_DEVICES of the process starting this node's part
    placement_group: Any  # the node's reservation (None for node 0: the worker already runs there)
    bundle_index: int
    engine_args: dict[str, Any]


def node_launch_plan(
    config: SglangConfig, engine_args: Mapping[str, Any], nodes: Sequence[Any], dist_init_port: int
) -> list[NodeLaunch]:
    """One :class:`NodeLaunch` per node of the worker (``nodes``: its NodeDevices, the worker's node first).

    Every node runs ``tp_size / nnodes`` GPUs (SGLang splits tensor-parallel ranks evenly over nodes), so each node's
    share of the worker's devices must have that size (:meth:`SglangConfig.node_layout_problem`).
    """
    sizes = [len(node.local_devices) for node in nodes]
    tp_size = int(engine_args["tp_size"])
    if sum(sizes) != tp_size:
        raise StrategyError(
            f"the worker owns {sum(sizes)} devices over {len(nodes)} node(s) but its sglang engine has tp_size="
            f"{tp_size}; make device_mapping give each worker {tp_size} devices"
        )
    problem = config.node_layout_problem(sizes)
    if problem:
        raise StrategyError(problem)
    multi = len(nodes) > 1
    address = f"{nodes[0].node_ip}:{dist_init_port}"
    plan = []
    for rank, node in enumerate(nodes):
        args = dict(engine_args)
        if multi:
            args.update(nnodes=len(nodes), node_rank=rank, dist_init_addr=address)
        plan.append(
            NodeLaunch(
                node_rank=rank,
                node_ip=node.node_ip,
                visible_devices=",".join(str(d) for d in node.local_devices),
                placement_group=None if rank == 0 else node.placement_group,
                bundle_index=node.bundle_index,
                engine_args=args,
            )
        )
    return plan
