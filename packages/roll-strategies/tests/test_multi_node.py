"""Engines over several nodes: which backends may span nodes, and the launch plans of vLLM and SGLang for a worker
placed over two 8-GPU nodes (pure functions; the engines themselves need a multi-node GPU cluster)."""

from __future__ import annotations

import pytest

from roll.runtime import ConfigError, NodeDevices, NodeShare, plan_devices
from roll.strategies import StrategyWorker, StrategyWorkerConfig
from roll.strategies.contract import StrategyError
from roll.strategies.registry import multi_node_strategies, runs_across_nodes
from roll.strategies.sglang._nodes import node_launch_plan
from roll.strategies.sglang.config import SglangConfig
from roll.strategies.vllm._nodes import engine_ranks, multi_node_engine_kwargs
from roll.strategies.vllm.config import VllmConfig

PG_A, PG_B = "reservation-of-node-a", "reservation-of-node-b"  # stand-ins for the nodes' placement groups


def two_nodes(per_node: tuple[int, int] = (8, 8)) -> tuple[NodeDevices, NodeDevices]:
    a, b = per_node
    return (
        NodeDevices(0, "node-a", "10.0.0.1", tuple(range(8 - a, 8)), tuple(range(8 - a, 8)), PG_A),
        NodeDevices(1, "node-b", "10.0.0.2", tuple(range(8, 8 + b)), tuple(range(b)), PG_B),
    )


def role(strategy: str, config: dict, devices: int = 16) -> StrategyWorkerConfig:
    return StrategyWorkerConfig(
        name="actor_infer",
        device_mapping=list(range(devices)),
        strategy_args={"strategy_name": strategy, "strategy_config": config},
    )


# --- which backends span nodes ---------------------------------------------------------------------------------
def test_only_engine_backends_declare_that_they_span_nodes() -> None:
    assert multi_node_strategies() == ["sglang", "vllm"]
    assert StrategyWorker.spans_nodes(role("vllm", {"tensor_parallel_size": 16}))
    assert StrategyWorker.spans_nodes(role("sglang", {"tp_size": 16}))
    for name in ("fsdp2_train", "hf_infer", "megatron_train", "mock_infer"):
        assert not StrategyWorker.spans_nodes(role(name, {}, devices=2)), name
    assert not runs_across_nodes(StrategyWorkerConfig(name="custom", device_mapping=[0, 1], num_gpus_per_worker=2))


def test_a_16_device_vllm_rank_on_8_gpu_nodes_is_planned_over_both() -> None:
    config = role("vllm", {"tensor_parallel_size": 16})
    assert config.num_gpus_per_worker == 16  # derived from TP x PP
    (plan,) = plan_devices(config, num_gpus_per_node=8, spans_nodes=StrategyWorker.spans_nodes(config))
    assert plan == (NodeShare(0, tuple(range(8)), tuple(range(8))), NodeShare(1, tuple(range(8, 16)), tuple(range(8))))


def test_a_worker_without_a_multi_node_engine_keeps_the_one_node_error() -> None:
    # fsdp2 gives each worker one device, so only a worker of its own (no multi-node engine) can ask for 16.
    with pytest.raises(ConfigError, match="uses 1 device"):
        StrategyWorkerConfig(
            name="actor_train",
            device_mapping=list(range(16)),
            num_gpus_per_worker=16,
            strategy_args={"strategy_name": "fsdp2_train"},
        )
    custom = StrategyWorkerConfig(name="actor_train", device_mapping=list(range(16)), num_gpus_per_worker=16)
    with pytest.raises(ConfigError, match=r"would span nodes \[0, 1\].*at most 8 devices"):
        plan_devices(custom, num_gpus_per_node=8, spans_nodes=StrategyWorker.spans_nodes(custom))


# --- vLLM: one Ray actor per engine rank, on the planned node and device -------------------------------------------
def test_vllm_tp16_ranks_follow_the_workers_devices_over_both_nodes() -> None:
    ranks = engine_ranks(VllmConfig(tensor_parallel_size=16), two_nodes())
    assert [r.rank for r in ranks] == list(range(16))
    assert [r.tp_rank for r in ranks] == list(range(16)) and {r.pp_rank for r in ranks} == {0}
    assert [(r.node_index, r.node_ip, r.local_device) for r in ranks] == [
        *[(0, "10.0.0.1", d) for d in range(8)],
        *[(1, "10.0.0.2", d) for d in range(8)],
    ]
    assert [r.placement_group for r in ranks] == [PG_A] * 8 + [PG_B] * 8
    assert {r.bundle_index for r in ranks} == {0}


def test_vllm_tp8_pp2_puts_one_pipeline_stage_on_each_node() -> None:
    ranks = engine_ranks(VllmConfig(tensor_parallel_size=8, pipeline_parallel_size=2), two_nodes())
    assert [(r.pp_rank, r.tp_rank, r.node_index) for r in ranks] == [
        *[(0, t, 0) for t in range(8)],
        *[(1, t, 1) for t in range(8)],
    ]


def test_vllm_plan_refuses_a_device_count_other_than_tp_x_pp() -> None:
    with pytest.raises(StrategyError, match=r"owns 12 devices over 2 node\(s\).*8 x 2 = 16"):
        engine_ranks(VllmConfig(tensor_parallel_size=8, pipeline_parallel_size=2), two_nodes((4, 8)))


def test_vllm_multi_node_uses_the_ray_executor() -> None:
    executor = object()
    assert multi_node_engine_kwargs(VllmConfig(tensor_parallel_size=16), executor) == {
        "distributed_executor_backend": executor
    }
    # ROLL's example asks for Ray explicitly: the same thing.
    roll_style = VllmConfig(tensor_parallel_size=16, engine_kwargs={"distributed_executor_backend": "ray"})
    assert multi_node_engine_kwargs(roll_style, executor)["distributed_executor_backend"] is executor
    with pytest.raises(StrategyError, match="'mp' cannot run an engine over several nodes"):
        multi_node_engine_kwargs(VllmConfig(engine_kwargs={"distributed_executor_backend": "mp"}), executor)
    with pytest.raises(StrategyError, match="in_process: true"):
        multi_node_engine_kwargs(VllmConfig(in_process=False), executor)


# --- SGLang: nnodes / node_rank / dist_init_addr, helpers on the other nodes --------------------------------------
def test_sglang_tp16_runs_node_rank_0_here_and_1_on_the_other_node() -> None:
    config = SglangConfig(tp_size=16)
    args = {"model_path": "/models/m", "tp_size": 16, "base_gpu_id": 0}
    here, there = node_launch_plan(config, args, two_nodes(), dist_init_port=29555)
    for launch, rank in ((here, 0), (there, 1)):
        assert launch.node_rank == rank
        assert launch.engine_args == {**args, "nnodes": 2, "node_rank": rank, "dist_init_addr": "10.0.0.1:29555"}
        assert launch.visible_devices == "0,1,2,3,4,5,6,7"
    assert (here.node_ip, here.placement_group) == ("10.0.0.1", None)  # node 0's engine is the worker's own
    assert (there.node_ip, there.placement_group, there.bundle_index) == ("10.0.0.2", PG_B, 0)


def test_sglang_on_one_node_keeps_its_arguments() -> None:
    node = two_nodes()[0]
    (launch,) = node_launch_plan(SglangConfig(tp_size=8), {"tp_size": 8}, [node], dist_init_port=1)
    assert launch.engine_args == {"tp_size": 8}


def test_sglang_needs_the_same_number_of_devices_on_every_node() -> None:
    config = SglangConfig(tp_size=8)
    with pytest.raises(StrategyError, match=r"split \[6, 2\] over its nodes"):
        node_launch_plan(config, {"tp_size": 8}, two_nodes((6, 2)), dist_init_port=1)
    with pytest.raises(StrategyError, match="owns 16 devices over 2 node"):
        node_launch_plan(config, {"tp_size": 8}, two_nodes(), dist_init_port=1)


def test_sglang_multi_node_arguments_are_roll_s_to_set() -> None:
    with pytest.raises(ConfigError, match="engine_kwargs.nnodes is set by roll"):
        SglangConfig(engine_kwargs={"nnodes": 2})


def test_a_vllm_worker_over_nodes_hands_the_engine_roll_s_ray_executor() -> None:
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from vllm.v1.executor.ray_executor import RayDistributedExecutor

    from roll.strategies.vllm.strategy import VllmStrategy

    config = role("vllm", {"tensor_parallel_size": 16, "engine_kwargs": {"distributed_executor_backend": "ray"}})
    worker = SimpleNamespace(worker_config=config, nodes=two_nodes(), rank=0)
    strategy = VllmStrategy(worker, VllmConfig(**config.strategy_args.strategy_config))
    executor = strategy._multi_node_kwargs()["distributed_executor_backend"]
    assert issubclass(executor, RayDistributedExecutor)
    assert [(r.rank, r.node_index, r.local_device) for r in executor.engine_ranks] == [
        (rank, rank // 8, rank % 8) for rank in range(16)
    ]
