"""Weight sync between real roles (Ray): fsdp2_train on 1/2 ranks -> two hf_infer workers, every transport.

After each sync the receivers hold exactly the trainer's weights. Failures are injected mid-sync on the sender
(an exception, a killed process) and on one receiver; the shared-memory segments never outlive a channel.
The receivers keep their own weights (``share_weights_on_node: false``) except in the last section, where the two
engines share one copy. vLLM as the receiver is covered by test_conformance.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import ray
import torch

from roll.protocol import DataProto, Dispatch, register
from roll.runtime import Cluster, RollError
from roll.runtime.testing import ship_module_by_value
from roll.strategies import (
    GenerationConfig,
    ModelArgs,
    ModelUpdateGroup,
    StrategyArgs,
    StrategyWorker,
    StrategyWorkerConfig,
)
from roll.strategies.weight_sync import Endpoint, WeightWriter, WriteStats
from roll.strategies.weight_sync.ring import PREFIX, SHM_DIR

ship_module_by_value(__name__)

BUCKET_MB = 0.2  # the 1.7 MB nano model travels in ~9 buckets (an odd count: slots alternate between syncs)


def segments() -> set[str]:
    return {path.name for path in SHM_DIR.glob(f"{PREFIX}*")}


class FaultyWriter(WeightWriter):
    """Wraps a rank's writer; fails (or hangs) when it reaches tensor ``at`` if the worker armed a fault.

    With ``wait_for`` (marker files), the fault first waits until they all exist: a test that needs the receivers
    to have loaded part of the sync does not depend on how far ahead of them the writers may run (ring slots).
    """

    def __init__(self, inner: WeightWriter, worker: TrainWorker) -> None:
        self.inner, self.worker = inner, worker
        self.specs, self.writes_shards = inner.specs, inner.writes_shards

    def write(self, start: int, stop: int, out: Sequence[torch.Tensor] | None, *, local: bool) -> WriteStats:
        fault = self.worker.fault
        if fault is not None and start >= fault["at"]:
            self.worker.fault = None
            deadline = time.monotonic() + 120
            while not all(Path(p).exists() for p in fault["wait_for"]) and time.monotonic() < deadline:
                time.sleep(0.01)
            if fault["action"] == "hang":
                Path(fault["marker"]).touch()
                time.sleep(600)
            raise RuntimeError("injected sender failure")
        return self.inner.write(start, stop, out, local=local)

    def finish(self) -> None:
        self.inner.finish()


class TrainWorker(StrategyWorker):
    fault: dict | None = None

    def weight_writer(self) -> WeightWriter:
        return FaultyWriter(super().weight_writer(), self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arm(self, at: int, action: str = "raise", marker: str = "", wait_for: Sequence[str] = ()) -> None:
        if self.rank == 0:
            self.fault = {"at": at, "action": action, "marker": marker, "wait_for": list(wait_for)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nudge(self, seed: int) -> None:
        """Change every weight (as a training step would)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.strategy.model.parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                local.add_(torch.randn(local.shape, generator=generator) * 0.01)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.train_strategy.named_weights()}


class InferWorker(StrategyWorker):
    far_ranks: tuple[int, ...] = ()

    def weight_endpoint(self) -> Endpoint:
        endpoint = super().weight_endpoint()
        if self.rank in self.far_ranks:  # pretend to run on another node (the broadcast path)
            return Endpoint(node=f"elsewhere-{self.rank}", pid=endpoint.pid)
        return endpoint

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def place_far(self, ranks: list[int]) -> None:
        self.far_ranks = tuple(ranks)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mark_loads(self, folder: str | None) -> None:
        """Touch ``folder/loaded-<rank>`` whenever a bucket reaches this worker's engine (None: stop)."""
        strategy = self._bare_strategy()
        vars(strategy).pop("update_weights", None)
        if folder is None:
            return
        original = strategy.update_weights
        marker = Path(folder) / f"loaded-{self.rank}"

        def marking(named_tensors):
            original(named_tensors)
            marker.touch()

        strategy.update_weights = marking

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arm(self, rank: int, after: int) -> None:
        """Make this worker's engine fail on its ``after``-th bucket."""
        if self.rank != rank:
            return
        strategy, calls = self.strategy, [0]
        original = strategy.update_weights

        def failing(named_tensors):
            calls[0] += 1
            if calls[0] > after:
                strategy.update_weights = original
                raise RuntimeError("injected engine failure")
            original(named_tensors)

        strategy.update_weights = failing

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self._bare_strategy().model.state_dict().items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def poke(self, rank: int) -> None:
        """Add 1 to the first weight of worker ``rank``'s engine, in place."""
        if self.rank == rank:
            with torch.no_grad():
                next(self._bare_strategy().model.parameters()).add_(1.0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def probe(self) -> str:
        """Generate with the model: raises if the last sync left it half-updated."""
        ids = torch.tensor([[5, 6, 7]])
        prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        self.strategy.generate(prompts, GenerationConfig(max_new_tokens=2, temperature=0.0))
        return "ok"


def role(model: Path, strategy: str, world_size: int, share: bool) -> StrategyWorkerConfig:
    return StrategyWorkerConfig(
        name=f"ws-{strategy}-{uuid.uuid4().hex[:6]}",
        world_size=world_size,
        model_args=ModelArgs(model_name_or_path=str(model), dtype="float32"),
        strategy_args=StrategyArgs(
            strategy_name=strategy, strategy_config={"share_weights_on_node": share} if strategy == "hf_infer" else {}
        ),
        system_envs={"OMP_NUM_THREADS": "1"},
    )


def start(model: Path, resources, worker_cls, strategy: str, world_size: int, share: bool = False) -> Cluster:
    config = role(model, strategy, world_size, share)
    cluster = Cluster(config.name, worker_cls, resources, config)
    cluster.initialize()
    return cluster


@pytest.fixture(scope="module")
def receivers(tiny_model, resources) -> Iterator[Cluster]:
    cluster = start(tiny_model, resources, InferWorker, "hf_infer", 2)
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module", params=[1, 2], ids=["1rank", "2ranks"])
def trainer(request, tiny_model, resources) -> Iterator[Cluster]:
    cluster = start(tiny_model, resources, TrainWorker, "fsdp2_train", request.param)
    yield cluster
    cluster.shutdown()


def mark_loads(receivers: Cluster, folder: Path) -> list[str]:
    """The marker files that appear once each receiver loaded a bucket (see InferWorker.mark_loads)."""
    receivers.mark_loads(str(folder))
    return [str(folder / f"loaded-{rank}") for rank in range(receivers.world_size)]


def assert_synced(trainer: Cluster, receivers: Cluster) -> None:
    expected = trainer.weights()[0]
    for got in receivers.weights():
        assert set(got) <= set(expected)
        mismatched = [name for name, tensor in got.items() if not torch.equal(tensor, expected[name])]
        assert not mismatched, mismatched[:5]


# --- every transport ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["auto", "shared_memory", "collective", "object_store"])
def test_every_receiver_gets_the_trainers_weights(transport, trainer, receivers):
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB, transport=transport)
    try:
        for seed in (1, 2):  # the second sync reuses the channel, with the slots swapped
            trainer.nudge(seed)
            metrics = group.update(seed, force=True)
            assert_synced(trainer, receivers)
            if transport != "object_store":
                assert not segments()  # the name is gone as soon as everyone mapped it
    finally:
        group.close()
    nbytes = sum(t.numel() * t.element_size() for t in trainer.weights()[0].values())
    assert metrics["weight_sync/bytes"] == metrics["weight_sync/received_bytes"] == nbytes
    assert metrics["weight_sync/buckets"] >= 5 and metrics["weight_sync/receivers"] == 2
    for phase in ("gather_s", "pack_s", "load_s", "finalize_s", "transport_s", "seconds"):
        assert metrics[f"weight_sync/{phase}"] >= 0
    assert 0 < metrics["weight_sync/transport_s"] <= metrics["weight_sync/seconds"] + 0.5
    if transport in ("auto", "shared_memory"):
        assert group.routes.readers == (0, 1) and group.routes.broadcast == ()
        assert group.routes.local_writes and len(group.routes.writers) == trainer.world_size
        assert metrics["weight_sync/gather_s"] == 0.0  # every rank wrote its own shards: nothing was gathered
    if transport == "collective":
        assert group.routes.broadcast == (0, 1) and metrics["weight_sync/broadcast_s"] > 0
    assert len(group.last_buckets.get("receiver", [[]])[0]) in (0, metrics["weight_sync/buckets"])


def test_auto_reads_in_place_on_the_node_and_broadcasts_elsewhere(trainer, receivers):
    receivers.place_far([1])
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB)
    try:
        trainer.nudge(3)
        metrics = group.update(0, force=True)
        assert group.routes.readers == (0,) and group.routes.broadcast == (1,)
        assert metrics["weight_sync/broadcast_s"] > 0
        assert_synced(trainer, receivers)
    finally:
        group.close()
        receivers.place_far([])


# --- failures midway ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["shared_memory", "collective"])
def test_a_sender_failure_midway_fences_the_receivers_off_until_a_sync_completes(
    transport, trainer, receivers, tmp_path
):
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB, transport=transport)
    try:
        group.update(0, force=True)
        assert receivers.probe() == ["ok", "ok"]
        trainer.nudge(4)
        # A few buckets in, once both engines loaded one of this sync's buckets. Without the wait the writers,
        # up to (ring slots - 1) buckets ahead, may fail before a receiver loaded anything: the receivers then
        # rightly keep their old weights unfenced (test_a_failure_before_the_first_bucket_keeps_the_old_weights).
        trainer.arm(at=8, wait_for=mark_loads(receivers, tmp_path))
        with pytest.raises(RollError, match="injected sender failure|aborted"):
            group.update(1, force=True)
        for rank in range(2):
            with pytest.raises(RollError, match="failed midway"):
                ray.get(receivers.workers[rank].probe.remote())
        group.update(2, force=True)  # the channel is rebuilt
        assert receivers.probe() == ["ok", "ok"]
        assert_synced(trainer, receivers)
        assert not segments()
    finally:
        receivers.mark_loads(None)
        group.close()


@pytest.mark.parametrize("engines", ["receivers", "sharing"], ids=["own_copies", "shared_copy"])
def test_a_failure_before_the_first_bucket_keeps_the_old_weights(engines, trainer, request):
    """Nothing reached the engines: they serve the old weights, unfenced (a shared copy's follower too)."""
    receivers = request.getfixturevalue(engines)
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB, transport="shared_memory")
    try:
        group.update(0, force=True)
        before = receivers.weights()
        trainer.nudge(5)
        trainer.arm(at=0)
        with pytest.raises(RollError, match="injected sender failure|aborted"):
            group.update(1, force=True)
        assert receivers.probe() == ["ok", "ok"]
        for old, now in zip(before, receivers.weights()):
            assert all(torch.equal(old[name], now[name]) for name in old)
    finally:
        group.close()


@pytest.mark.parametrize("transport", ["shared_memory", "collective"])
def test_one_receivers_engine_failing_leaves_the_other_receiver_complete(transport, trainer, receivers):
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB, transport=transport)
    try:
        trainer.nudge(6)
        receivers.arm(rank=1, after=2)
        with pytest.raises(RollError, match="injected engine failure"):
            group.update(0, force=True)
        expected = trainer.weights()[0]
        complete = ray.get(receivers.workers[0].weights.remote())
        assert all(torch.equal(t, expected[name]) for name, t in complete.items())
        assert ray.get(receivers.workers[0].probe.remote()) == "ok"
        with pytest.raises(RollError, match="failed midway"):
            ray.get(receivers.workers[1].probe.remote())
        group.update(1, force=True)
        assert receivers.probe() == ["ok", "ok"]
        assert_synced(trainer, receivers)
    finally:
        group.close()


# --- killed processes and cleanup ---------------------------------------------------------------------------------
@pytest.mark.slow  # two roles of two ranks started for this test alone, one of them killed (52 s beside another batch)
def test_a_sender_killed_midway_fails_the_sync_quickly_and_leaves_no_segment(tiny_model, resources, tmp_path):
    trainer = start(tiny_model, resources, TrainWorker, "fsdp2_train", 2)
    receivers = start(tiny_model, resources, InferWorker, "hf_infer", 2)
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB, transport="shared_memory")
    try:
        group.update(0, force=True)
        marker = tmp_path / "hanging"
        trainer.arm(at=8, action="hang", marker=str(marker), wait_for=mark_loads(receivers, tmp_path))
        errors: list[BaseException] = []
        sync = threading.Thread(target=lambda: _capture(errors, lambda: group.update(1, force=True)))
        sync.start()
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the sender never reached the hanging bucket"
        ray.kill(trainer.workers[0], no_restart=True)
        killed_at = time.monotonic()
        sync.join(120)
        assert not sync.is_alive() and errors and isinstance(errors[0], RollError)
        assert time.monotonic() - killed_at < 60  # noticed by the others' liveness checks, not a timeout
        for rank in range(2):
            with pytest.raises(RollError, match="failed midway"):
                ray.get(receivers.workers[rank].probe.remote())
        assert not segments()
    finally:
        group.close(timeout_s=30)
        trainer.shutdown()
        receivers.shutdown()
    assert not segments()


def test_shutting_roles_down_without_closing_leaves_no_segment(tiny_model, resources):
    trainer = start(tiny_model, resources, TrainWorker, "fsdp2_train", 1)
    receivers = start(tiny_model, resources, InferWorker, "hf_infer", 1)
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=BUCKET_MB, transport="shared_memory")
    group.update(0, force=True)
    trainer.shutdown()  # killed: no close_weight_channel ever runs
    receivers.shutdown()
    assert not segments()


# --- engines sharing one copy of the weights ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharing(tiny_model, resources) -> Iterator[Cluster]:
    cluster = start(tiny_model, resources, InferWorker, "hf_infer", 2, share=True)
    yield cluster
    cluster.shutdown()


@pytest.mark.parametrize("transport", ["auto", "shared_memory"])
def test_engines_on_one_node_share_one_copy_that_only_the_leader_loads(transport, trainer, sharing, tmp_path):
    group = ModelUpdateGroup(trainer, sharing, bucket_size_mb=BUCKET_MB, transport=transport)
    try:
        markers = mark_loads(sharing, tmp_path)
        for seed in (7, 8):
            trainer.nudge(seed)
            metrics = group.update(seed, force=True)
            assert_synced(trainer, sharing)
            assert not segments()  # the ring's and the shared weights' names are gone once mapped
        assert group.routes.readers == (0,) and group.routes.shares == ((1, 0),)
        assert Path(markers[0]).exists() and not Path(markers[1]).exists()  # the follower loaded nothing
        nbytes = sum(t.numel() * t.element_size() for t in trainer.weights()[0].values())
        assert metrics["weight_sync/received_bytes"] == nbytes and metrics["weight_sync/receivers"] == 2
        # One copy: a write through the leader's engine is what the follower computes with.
        sharing.poke(0)
        leader, follower = sharing.weights()
        first = next(iter(leader))
        assert torch.equal(leader[first], follower[first]) and not torch.equal(
            leader[first], trainer.weights()[0][first]
        )
        group.update(9, force=True)
        assert_synced(trainer, sharing)
    finally:
        sharing.mark_loads(None)
        group.close()
    assert sharing.probe() == ["ok", "ok"]


def test_the_leaders_engine_failing_midway_fences_its_follower_too(trainer, sharing):
    group = ModelUpdateGroup(trainer, sharing, bucket_size_mb=BUCKET_MB, transport="shared_memory")
    try:
        group.update(0, force=True)
        trainer.nudge(10)
        sharing.arm(rank=0, after=2)
        with pytest.raises(RollError, match="injected engine failure"):
            group.update(1, force=True)
        for rank in range(2):
            with pytest.raises(RollError, match="failed midway"):
                ray.get(sharing.workers[rank].probe.remote())
        group.update(2, force=True)  # the channel is rebuilt, with a new shared copy
        assert group.routes.shares == ((1, 0),)
        assert sharing.probe() == ["ok", "ok"]
        assert_synced(trainer, sharing)
        assert not segments()
    finally:
        group.close()


def test_broadcast_receivers_keep_their_own_weights(trainer, sharing):
    group = ModelUpdateGroup(trainer, sharing, bucket_size_mb=BUCKET_MB, transport="collective")
    try:
        trainer.nudge(12)
        group.update(0, force=True)
        assert group.routes.shares == () and group.routes.broadcast == (0, 1)
        assert_synced(trainer, sharing)
    finally:
        group.close()


def _capture(errors: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as e:  # handed to the test thread
        errors.append(e)
