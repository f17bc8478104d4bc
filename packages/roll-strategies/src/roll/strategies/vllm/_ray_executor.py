"""roll's Ray executor for a vLLM engine over several nodes (GPU only; the plan it follows is built in ``_nodes``).

vLLM's own Ray executors look for one placement group with a one-GPU bundle per engine rank and read each rank's
GPU from Ray's assignment. roll reserves each node's GPUs as one bundle that every role joins with a token share
(so roles can be colocated) and pins devices itself. This executor therefore creates the engine's rank actors
itself: rank ``r`` joins the bundle of the node the plan names, sees only its planned device, and gets vLLM's usual
initialisation (rank adjustment, environment, ``init_worker``, device, model). Written against vLLM's legacy V1
``RayDistributedExecutor`` (vLLM 0.1x-0.3x); it runs only on a multi-node GPU cluster, which roll's CI lacks.
"""

from __future__ import annotations

import os
from typing import Any

from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from vllm.platforms import current_platform
from vllm.ray.ray_env import get_env_vars_to_copy
from vllm.utils.network_utils import get_distributed_init_method, get_ip, get_open_port
from vllm.v1.executor.ray_executor import RayDistributedExecutor
from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS, RayWorkerWrapper, ray

from roll.runtime import GPU_SHARE_PER_ACTOR
from roll.strategies.contract import StrategyError
from roll.strategies.vllm._nodes import EngineRank

__all__ = ["RollRayExecutor", "executor_for"]


def executor_for(ranks: list[EngineRank]) -> type[RollRayExecutor]:
    """An executor class that places the engine's ranks as ``ranks`` says (vLLM takes a class, not an instance)."""
    return type("RollNodesExecutor", (RollRayExecutor,), {"engine_ranks": tuple(ranks)})


def _update_block_size(worker: Any) -> None:
    update = getattr(current_platform, "update_block_size_for_backend", None)
    if update is not None:
        update(worker.vllm_config)


class RollRayExecutor(RayDistributedExecutor):  # type: ignore[misc]
    """Ray executor over roll's per-node reservations; ``engine_ranks`` is set by :func:`executor_for`."""

    engine_ranks: tuple[EngineRank, ...] = ()

    def _init_executor(self) -> None:
        # vLLM's version first validates/creates its own placement group (initialize_ray_cluster); roll's are made.
        self.forward_dag = None
        if os.environ.get("RAY_USAGE_STATS_ENABLED", "0") != "1":
            os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        self._init_workers_ray(None)
        self.has_connector = self.vllm_config.kv_transfer_config is not None
        ec_config = self.vllm_config.ec_transfer_config
        self.uses_sampler = self.vllm_config.model_config.runner_type != "pooling" and (
            ec_config is None or ec_config.is_ec_consumer
        )
        self.scheduler_output = None

    def _spawn(self, rank: EngineRank) -> Any:
        env = {"CUDA_VISIBLE_DEVICES": str(rank.local_device)}
        options = self._update_noset_device_env_vars({"runtime_env": {"env_vars": env}})
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=rank.placement_group, placement_group_bundle_index=rank.bundle_index
        )
        remote = ray.remote(num_cpus=0, num_gpus=GPU_SHARE_PER_ACTOR, scheduling_strategy=strategy, **options)
        return remote(RayWorkerWrapper).remote(rpc_rank=rank.rank)

    def _init_workers_ray(self, placement_group: Any, **ray_remote_kwargs: Any) -> None:
        ranks = self.engine_ranks
        if len(ranks) != self.parallel_config.world_size:
            raise StrategyError(
                f"roll planned {len(ranks)} engine ranks, vLLM expects {self.parallel_config.world_size}"
            )
        self.driver_dummy_worker = None
        workers: list[Any] = [self._spawn(rank) for rank in ranks]  # actor handles (vLLM types them as wrappers)
        self.workers = workers
        ips = ray.get([worker.get_node_ip.remote() for worker in workers])
        misplaced = [(r.rank, r.node_ip, ip) for r, ip in zip(ranks, ips) if r.node_ip and ip != r.node_ip]
        if misplaced:
            raise StrategyError(f"engine ranks landed on other nodes than planned (rank, planned, actual): {misplaced}")
        self.collective_rpc("adjust_rank", args=({r.rank: r.rank for r in ranks},))
        names = get_env_vars_to_copy(
            exclude_vars=WORKER_SPECIFIC_ENV_VARS,
            additional_vars=set(current_platform.additional_env_vars),
            destination="workers",
        )
        self._env_vars_for_all_workers = [{n: os.environ[n] for n in names if n in os.environ} for _ in ranks]
        self.collective_rpc("update_environment_variables", args=(self._get_env_vars_to_be_updated(),))
        # Rank 0 runs on this (the worker's) node, so a port free here is free where the store listens.
        init_method = get_distributed_init_method(get_ip(), get_open_port())
        all_kwargs = [
            {
                "vllm_config": self.vllm_config,
                "local_rank": 0,  # each rank sees exactly its one device
                "rank": r.rank,
                "distributed_init_method": init_method,
                "is_driver_worker": r.tp_rank == 0,
            }
            for r in ranks
        ]
        self.collective_rpc("init_worker", args=(all_kwargs,))
        self.collective_rpc("init_device")
        self.collective_rpc("load_model")
        self.collective_rpc(_update_block_size)
        tp = self.parallel_config.tensor_parallel_size
        self.pp_tp_workers = [
            self.workers[pp * tp : (pp + 1) * tp] for pp in range(self.parallel_config.pipeline_parallel_size)
        ]
