"""plan_devices on a described cluster (no Ray): which node and local devices each rank gets, and when a rank may
span nodes."""

from __future__ import annotations

import pytest

from roll.runtime import ConfigError, NodeShare, Worker, WorkerConfig, plan_devices


def test_one_node_ranks_get_their_node_and_local_ids() -> None:
    config = WorkerConfig(name="train", device_mapping=list(range(4, 12)), num_gpus_per_worker=2)
    plans = plan_devices(config, num_gpus_per_node=8)
    assert plans == [
        (NodeShare(0, (4, 5), (4, 5)),),
        (NodeShare(0, (6, 7), (6, 7)),),
        (NodeShare(1, (8, 9), (0, 1)),),
        (NodeShare(1, (10, 11), (2, 3)),),
    ]


def test_a_spanning_rank_lists_every_node_first_device_first() -> None:
    # 2 nodes x 8 GPUs, one worker of 16 devices (ROLL's TP=16 vLLM engine on 8-GPU nodes).
    config = WorkerConfig(name="actor_infer", device_mapping=list(range(16)), num_gpus_per_worker=16)
    (plan,) = plan_devices(config, num_gpus_per_node=8, spans_nodes=True)
    assert plan == (NodeShare(0, tuple(range(8)), tuple(range(8))), NodeShare(1, tuple(range(8, 16)), tuple(range(8))))


def test_a_spanning_rank_keeps_its_device_order() -> None:
    # Devices listed from the second node first: the worker runs there (its first device's node).
    config = WorkerConfig(name="gen", device_mapping=[12, 13, 14, 15, 0, 1, 2, 3], num_gpus_per_worker=8)
    (plan,) = plan_devices(config, num_gpus_per_node=8, spans_nodes=True)
    assert [share.node_rank for share in plan] == [1, 0]
    assert plan[0].local_devices == (4, 5, 6, 7) and plan[1].local_devices == (0, 1, 2, 3)


def test_a_rank_over_nodes_is_refused_unless_its_worker_spans_nodes() -> None:
    config = WorkerConfig(name="actor_train", device_mapping=list(range(16)), num_gpus_per_worker=16)
    with pytest.raises(ConfigError) as caught:
        plan_devices(config, num_gpus_per_node=8)
    message = str(caught.value)
    assert "actor_train rank 0 would span nodes [0, 1]" in message
    assert "at most 8 devices" in message and "a backend that runs one engine over several nodes" in message


def test_the_base_worker_does_not_span_nodes() -> None:
    config = WorkerConfig(name="w", device_mapping=list(range(16)), num_gpus_per_worker=16)
    assert Worker.spans_nodes(config) is False
