"""Run as a script by test_multinode.py: a simulated 2-node x 4-GPU Ray cluster (fake GPUs as resources).

Prints one JSON line describing where each worker landed, so the test can assert on it.
"""

from __future__ import annotations

import json
import os
import sys

import ray
from ray.cluster_utils import Cluster as RayTestCluster
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from roll.runtime import (
    GPU_SHARE_PER_ACTOR,
    Cluster,
    ConfigError,
    Dispatch,
    ResourceManager,
    Worker,
    WorkerConfig,
    register,
)
from roll.runtime.testing import ship_module_by_value


class WhereWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {
            "rank": self.rank,
            "node_id": ray.get_runtime_context().get_node_id(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")],
        }


class Probe:
    def where(self):
        return {"node_id": ray.get_runtime_context().get_node_id(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


class SpanningWorker(WhereWorker):
    """A worker class that runs one engine over nodes: starts a helper on each node's reservation, as engines do."""

    @classmethod
    def spans_nodes(cls, worker_config):
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_helpers(self):
        out = []
        for node in self.nodes:
            visible = ",".join(str(d) for d in node.local_devices)
            helper = (
                ray.remote(Probe)
                .options(
                    num_cpus=0,
                    num_gpus=GPU_SHARE_PER_ACTOR,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=node.placement_group, placement_group_bundle_index=node.bundle_index
                    ),
                    runtime_env={
                        "env_vars": {
                            "CUDA_VISIBLE_DEVICES": visible,
                            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
                        }
                    },
                )
                .remote()
            )
            landed = ray.get(helper.where.remote(), timeout=120)
            ray.kill(helper)
            out.append(
                {
                    "node_rank": node.node_rank,
                    "node_id": node.node_id,
                    "global": list(node.global_devices),
                    "local": list(node.local_devices),
                    "helper": landed,
                }
            )
        return out


def main() -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ship_module_by_value(__name__)
    fake = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 8, "num_gpus": 4})
    fake.add_node(num_cpus=8, num_gpus=4)
    fake.wait_for_nodes()
    ray.init(address=fake.address, namespace="multinode")
    try:
        manager = ResourceManager()
        report = {
            "nodes": [n.node_id for n in manager.gpu_nodes],
            "total_devices": manager.total_devices,
        }
        gpu = Cluster(
            "gpu",
            WhereWorker,
            manager,
            WorkerConfig(name="gpu", device_mapping="list(range(0, 8))", num_gpus_per_worker=2),
        )
        report["gpu"] = gpu.where()
        colocated = Cluster(
            "colocated",
            WhereWorker,
            manager,
            WorkerConfig(name="colocated", device_mapping=[2, 3], num_gpus_per_worker=2),
        )
        report["colocated"] = colocated.where()
        cpu = Cluster("cpu", WhereWorker, manager, WorkerConfig(name="cpu", world_size=4))
        report["cpu"] = cpu.where()
        spanning = Cluster(
            "spanning",
            SpanningWorker,
            manager,
            WorkerConfig(name="spanning", device_mapping=[2, 3, 4, 5], num_gpus_per_worker=4),
        )
        report["spanning"] = {"where": spanning.where(), "helpers": spanning.start_helpers()}
        errors = []
        for mapping, per_worker in (([8], 1), ([2, 3, 4], 3)):
            try:
                manager.allocate(WorkerConfig(name="bad", device_mapping=mapping, num_gpus_per_worker=per_worker))
            except ConfigError as e:
                errors.append(str(e))
        report["errors"] = errors
        for cluster in (gpu, colocated, cpu, spanning):
            cluster.shutdown()
        manager.destroy()
    finally:
        ray.shutdown()
        fake.shutdown()
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
