"""Cluster behaviour on a real local Ray: every dispatch mode, blocking/non-blocking, async, errors."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import weakref

import pytest
import ray
import torch

from roll.runtime import (
    Cluster,
    ConfigError,
    DataProto,
    Dispatch,
    Execute,
    PendingCall,
    ProtocolError,
    RankInfo,
    ResourceManager,
    RpcTimeoutError,
    Worker,
    WorkerConfig,
    WorkerError,
    WorkerLostError,
    materialize_concat,
    register,
)
from roll.runtime.testing import ship_module_by_value

ship_module_by_value(__name__)


class EchoWorker(Worker):
    def __init__(self, worker_config):
        super().__init__(worker_config)
        self.calls = 0
        self.seen: list[int] = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self):
        self.calls += 1
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def representative(self):
        return f"rank {self.rank}"

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def scale(self, value, factor):
        return value * factor

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def tag_rows(self, data: DataProto) -> DataProto:
        self.seen.append(len(data))
        data.batch["by_rank"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=Dispatch.DP_MP_DISPATCH_FIRST)
    def rows_received(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(non_tensors={"got": [f"rank {self.rank}: {len(data)}"]})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self):
        self.calls += 1
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def call_count(self):
        return self.calls

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shards_seen(self):
        return list(self.seen)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self):
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ROLL_TEST_ENV")
        return {k: os.environ.get(k) for k in keys}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def threads(self):
        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int, exit_process: bool = False):
        if self.rank == rank:
            if exit_process:
                os._exit(1)
            raise ValueError(f"bad input on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_on(self, rank: int, seconds: float):
        if self.rank == rank:
            time.sleep(seconds)
        return self.rank


class ModelParallelWorker(EchoWorker):
    """Declares a dp x tp x pp topology in initialize, as a model-parallel strategy would."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, settings=None):
        super().initialize(settings)
        tp, pp = settings["tp"], settings["pp"]
        dp = self.world_size // (tp * pp)
        self.set_rank_info(
            RankInfo(
                rank=self.rank,
                world_size=self.world_size,
                tp_rank=self.rank % tp,
                tp_size=tp,
                dp_rank=(self.rank // tp) % dp,
                dp_size=dp,
                pp_rank=self.rank // (tp * dp),
                pp_size=pp,
            )
        )


class AsyncWorker(Worker):
    def __init__(self, worker_config):
        super().__init__(worker_config)
        self.signal = asyncio.Event()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def wait_for_signal(self):
        await asyncio.wait_for(self.signal.wait(), timeout=30)
        return f"released {self.rank}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def release(self):
        self.signal.set()
        return True


@pytest.fixture(scope="module")
def echo(resources):
    cluster = Cluster(
        "echo", EchoWorker, resources, WorkerConfig(name="echo", world_size=3, system_envs={"ROLL_TEST_ENV": "yes"})
    )
    yield cluster
    cluster.shutdown()


def test_one_to_all_one_to_all_one_and_all_to_all(echo):
    assert echo.whoami() == [0, 1, 2]
    assert echo.representative() == "rank 0"
    assert echo.scale([1, 2, 3], factor=[10, 10, 100]) == [10, 20, 300]


def test_dp_compute_splits_unevenly_and_collects_in_order(echo):
    data = DataProto.from_dict({"row": torch.arange(7)}, {"text": [f"t{i}" for i in range(7)]})
    out = echo.tag_rows(data)
    assert out["row"].tolist() == list(range(7))
    assert out["text"].tolist() == [f"t{i}" for i in range(7)]
    assert out["by_rank"].tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert [seen[-1] for seen in echo.shards_seen()] == [3, 2, 2]


def test_rank_zero_execution_runs_on_rank_zero_only(echo):
    before = echo.call_count()
    assert echo.only_rank_zero() == 0
    after = echo.call_count()
    assert after[0] == before[0] + 1 and after[1:] == before[1:]


def test_non_blocking_calls_return_pending_results(echo):
    pending = echo.whoami(blocking=False)
    assert isinstance(pending, PendingCall)
    assert ray.get(pending) == [0, 1, 2]
    data = DataProto.from_dict({"row": torch.arange(5)})
    result = materialize_concat(echo.tag_rows(data, blocking=False))
    assert result["row"].tolist() == [0, 1, 2, 3, 4]
    # Several calls, plain ObjectRefs and finished results, concatenated in order.
    halves = data.chunk(2)
    second = echo.tag_rows(halves[1])
    mixed = [echo.tag_rows(halves[0], blocking=False), ray.put(second), second]
    assert materialize_concat(mixed)["row"].tolist() == [0, 1, 2, 3, 4, 3, 4]
    with pytest.raises(ProtocolError, match="expects DataProto results, got int"):
        materialize_concat(echo.whoami(blocking=False))


def test_typed_method_handles_check_against_the_worker_class(echo):
    tag_rows = echo.method(EchoWorker.tag_rows)
    assert tag_rows(DataProto.from_dict({"row": torch.arange(3)}))["by_rank"].tolist() == [0, 1, 2]
    pending = echo.method(EchoWorker.whoami).submit()
    assert isinstance(pending, PendingCall) and pending.materialize() == [0, 1, 2]
    with pytest.raises(RpcTimeoutError, match="within 1 s"):
        echo.method(EchoWorker.sleep_on).with_timeout(1)(1, 5)
    with pytest.raises(ConfigError, match="not a registered method of EchoWorker"):
        echo.method(EchoWorker.__init__)


def test_registered_methods_are_visible_to_introspection(echo):
    assert isinstance(echo, Cluster) and type(echo) is not Cluster
    assert type(echo).__name__ == "Cluster[EchoWorker]"
    assert {"tag_rows", "whoami", "initialize", "get_rank_info"} <= set(dir(echo))
    assert "fail_on" in dir(type(echo))  # on the class, not set on the instance
    assert "tag_rows" not in vars(echo)
    signature = inspect.signature(echo.fail_on)
    assert list(signature.parameters) == ["rank", "exit_process", "blocking", "timeout"]
    assert signature.parameters["blocking"].kind is inspect.Parameter.KEYWORD_ONLY
    assert echo.fail_on.__name__ == "fail_on"
    assert type(echo).sleep_on.registration.dispatch_mode is Dispatch.ONE_TO_ALL
    assert "shards_seen" in repr(type(echo).shards_seen)


def _dies(actor, timeout_s: float = 60.0) -> bool:
    """Whether the actor is gone within ``timeout_s`` (a kill takes effect asynchronously: a call sent right after
    it may still be answered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_a_dropped_cluster_frees_its_actors_and_names_without_the_garbage_collector(resources):
    config = WorkerConfig(name="dropped", world_size=2)
    cluster = Cluster("dropped", EchoWorker, resources, config)
    assert cluster.whoami() == [0, 1]
    actors = list(cluster.workers)
    gone = weakref.ref(cluster)
    del cluster  # no gc.collect(): nothing may hold the cluster in a cycle
    assert gone() is None
    assert all(_dies(a) for a in actors)
    again = Cluster("dropped", EchoWorker, resources, config)
    try:
        assert again.whoami() == [0, 1]
    finally:
        again.shutdown()


def test_a_pickled_cluster_is_a_view_that_does_not_own_the_actors(echo):
    import pickle

    copy = ray.cloudpickle.loads(ray.cloudpickle.dumps(echo))
    assert type(copy) is type(echo) and copy.whoami() == [0, 1, 2]
    assert "tag_rows" in dir(copy)
    del copy  # dropping a copy (as a worker does with a cluster it was handed) leaves the actors running
    assert echo.whoami() == [0, 1, 2]
    assert pickle.loads(pickle.dumps(echo)).representative() == "rank 0"
    assert echo.whoami() == [0, 1, 2]


def test_a_cluster_is_a_context_manager_and_a_shut_down_one_refuses_calls(resources):
    config = WorkerConfig(name="scoped", world_size=2)
    with Cluster("scoped", EchoWorker, resources, config) as cluster:
        assert cluster.whoami() == [0, 1]
        actors = list(cluster.workers)
    assert cluster.workers == [] and all(_dies(a) for a in actors)
    with pytest.raises(WorkerLostError, match="scoped rank 0 died during whoami\\(\\): the cluster was shut down"):
        cluster.whoami()
    cluster.shutdown()  # twice is fine
    with Cluster("scoped", EchoWorker, resources, config) as again:  # the name is free again
        assert again.whoami() == [0, 1]


def test_workers_get_rank_env_rendezvous_and_system_envs(echo, resources):
    env = echo.environment()
    assert [e["RANK"] for e in env] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in env} == {"3"}
    assert {e["ROLL_TEST_ENV"] for e in env} == {"yes"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in env}) == 1
    assert (env[0]["MASTER_ADDR"], int(env[0]["MASTER_PORT"])) == echo.master_address
    other = Cluster("echo_other", EchoWorker, resources, WorkerConfig(name="echo_other", world_size=1))
    try:
        assert other.master_address != echo.master_address
    finally:
        other.shutdown()


@pytest.mark.slow  # eight actors, each a process importing torch
def test_model_parallel_topology_collects_only_valid_ranks(resources):
    cluster = Cluster("mp", ModelParallelWorker, resources, WorkerConfig(name="mp", world_size=8))
    try:
        cluster.initialize({"tp": 2, "pp": 2})
        assert (cluster.dp_size, cluster.tp_size, cluster.pp_size) == (2, 2, 2)
        data = DataProto.from_dict({"row": torch.arange(6)})
        out = cluster.tag_rows(data)
        # Each dp shard went to the object store once, shared by the 4 ranks of its model-parallel group.
        assert cluster.last_call_stats["object_store_puts"] == 2
        assert out["row"].tolist() == list(range(6))
        # Output ranks: tp_rank 0 on the last pipeline stage, one per dp rank.
        assert out["by_rank"].tolist() == [4, 4, 4, 6, 6, 6]
        # Every rank of a model-parallel group received its dp shard.
        assert [seen[-1] for seen in cluster.shards_seen()] == [3] * 8
        first = cluster.rows_received(data)
        assert first["got"].tolist() == ["rank 4: 0", "rank 6: 0"]  # collected ranks are not pp stage 0
    finally:
        cluster.shutdown()


def test_dispatch_first_gives_data_to_the_first_rank_of_each_group(resources):
    cluster = Cluster("mp_first", ModelParallelWorker, resources, WorkerConfig(name="mp_first", world_size=2))
    try:
        cluster.initialize({"tp": 2, "pp": 1}, blocking=False)  # topology refresh waits for it
        out = cluster.rows_received(DataProto.from_dict({"row": torch.arange(4)}))
        assert out["got"].tolist() == ["rank 0: 4"]
    finally:
        cluster.shutdown()


def test_async_methods_run_concurrently(resources):
    cluster = Cluster("async", AsyncWorker, resources, WorkerConfig(name="async", world_size=2))
    try:
        waiting = cluster.wait_for_signal(blocking=False)
        assert cluster.release() == [True, True]
        assert waiting.materialize(timeout=30) == ["released 0", "released 1"]
    finally:
        cluster.shutdown()


def test_exception_in_a_worker_names_cluster_rank_method_and_traceback(echo):
    with pytest.raises(WorkerError) as info:
        echo.fail_on(rank=1)
    error = info.value
    assert (error.cluster, error.rank, error.method) == ("echo", 1, "fail_on")
    assert "echo rank 1 failed in fail_on()" in str(error)
    assert "ValueError: bad input on rank 1" in error.remote_traceback


def test_failures_surface_without_waiting_for_other_ranks(echo):
    # Rank 2 raises while rank 0 is stuck; the error must not wait for the 60 s timeout. (The module's cluster is
    # shared, so the test waits out rank 0's sleep at the end: a few seconds keep it stuck while rank 2 answers.)
    stuck = echo.sleep_on(0, 5, blocking=False)
    with pytest.raises(WorkerError) as info:
        echo.fail_on(2, timeout=60)
    assert info.value.rank == 2 and not isinstance(info.value, WorkerLostError)
    assert stuck.materialize() == [0, 1, 2]


def test_timeout_names_the_pending_ranks(echo):
    with pytest.raises(
        RpcTimeoutError, match=r"echo.sleep_on\(\) did not finish within 1 s; ranks still running: \[1\]"
    ):
        echo.sleep_on(1, 3, timeout=1)
    echo.whoami()  # the cluster stays usable once the slow call ends


@pytest.mark.parametrize(
    ("setting", "world_size", "expected"),
    [(None, 2, lambda cores: 1), (3, 1, lambda cores: 3), ("all", 1, lambda cores: cores), ("all", 2, None)],
)
def test_num_threads_sizes_each_workers_torch_pool(resources, setting, world_size, expected):
    from roll.runtime._worker import usable_cores

    cores = usable_cores()
    # 'all' shares the node's cores among the role's workers on it (at least one thread each).
    want = expected(cores) if expected else max(1, cores // world_size)
    name = f"threads{world_size}{setting}"
    cluster = Cluster(name, EchoWorker, resources, WorkerConfig(name=name, world_size=world_size, num_threads=setting))
    try:
        assert cluster.threads() == [(want, str(want))] * world_size
    finally:
        cluster.shutdown()


def test_num_threads_rejects_nonsense():
    with pytest.raises(ValueError, match="num_threads"):
        WorkerConfig(name="x", num_threads=0)
    with pytest.raises(ValueError, match="num_threads"):
        WorkerConfig(name="x", num_threads="most")


def _kill_and_wait(actor, timeout_s: float = 60.0) -> None:
    """ray.kill returns before the actor is gone; a call sent meanwhile may still be answered. Wait for death."""
    ray.kill(actor)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_dead_workers_raise_worker_lost(resources):
    cluster = Cluster("doomed", EchoWorker, resources, WorkerConfig(name="doomed", world_size=2))
    try:
        with pytest.raises(WorkerLostError) as info:
            cluster.fail_on(1, exit_process=True)
        assert (info.value.cluster, info.value.rank) == ("doomed", 1)
        _kill_and_wait(cluster.workers[0])
        with pytest.raises(WorkerLostError, match="doomed rank 0 died during whoami"):
            cluster.execute_rank_zero("whoami")
        # Both ranks are dead now; whichever failure is seen first is reported, never a hang.
        with pytest.raises(WorkerLostError, match=r"doomed rank [01] died during whoami"):
            cluster.whoami()
    finally:
        cluster.shutdown()


def test_execute_all_and_rank_zero(echo):
    assert echo.execute_all("whoami") == [0, 1, 2]
    assert echo.execute_rank_zero("representative") == "rank 0"


def test_unschedulable_workers_time_out_with_a_resource_hint(resources):
    config = WorkerConfig(name="huge", world_size=1, num_cpus_per_worker=10_000, start_timeout_s=3)
    # Infeasible requests fail at once (WorkerLostError); ones that might fit later time out. Both say why.
    with pytest.raises(
        (RpcTimeoutError, WorkerLostError), match="could not be scheduled: each asks for num_cpus=10000"
    ):
        Cluster("huge", EchoWorker, resources, config)


def test_duplicate_cluster_names_and_bad_worker_classes_are_config_errors(echo, resources):
    with pytest.raises(ConfigError, match="already exists"):
        Cluster("echo", EchoWorker, resources, WorkerConfig(name="echo", world_size=1))
    with pytest.raises(ConfigError, match="must subclass roll.runtime.Worker"):
        Cluster("plain", dict, resources, WorkerConfig(name="plain"))
    with pytest.raises(ConfigError, match="cannot be imported"):
        Cluster("missing", "no_such_module.Worker", resources, WorkerConfig(name="missing"))


def test_device_mapping_on_a_cpu_only_cluster_is_a_config_error(resources):
    with pytest.raises(
        ConfigError,
        match="no GPUs: to run gpu_role on CPU workers, set gpu_role.device_mapping=null and gpu_role.world_size",
    ):
        Cluster("gpu_role", EchoWorker, resources, WorkerConfig(name="gpu_role", device_mapping=[0]))


def test_gpus_asked_of_a_cpu_only_cluster_name_the_cpu_settings(resources):
    """A GPU file (ROLL's num_gpus_per_node: 8) on a machine without GPUs: the error says how to run it on CPU."""
    with pytest.raises(
        ConfigError,
        match=r"only 0 node\(s\) have that many GPUs \(\[\]\); lower num_nodes or num_gpus_per_node \(this Ray cluster "
        r"has no GPUs: to run on CPU workers, set num_gpus_per_node=0 and each role's device_mapping=null with a "
        r"world_size\)$",
    ):
        ResourceManager(num_nodes=1, num_gpus_per_node=8)
