"""The weight-sync building blocks without Ray: sync plans, the shared-memory ring, routes, the torn-weights guard.

The ring tests run real processes (``multiprocessing`` with spawn) that map the same ``/dev/shm`` segment.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest
import torch

from roll.runtime import ConfigError
from roll.runtime.testing import spawn_process
from roll.strategies.base import StrategyError
from roll.strategies.weight_sync import Endpoint, TensorSpec, WeightSyncAborted, build_plan, plan_routes
from roll.strategies.weight_sync.plan import ALIGN, slot_views, specs_of
from roll.strategies.weight_sync.receiver import TornWeightsGuard
from roll.strategies.weight_sync.ring import PREFIX, SHM_DIR, SharedRing, sweep_stale_segments
from roll.strategies.weight_sync.shared_weights import (
    SharedWeights,
    SharedWeightsTorn,
    adopt_shared_weights,
    page_align_parameters,
    shared_layout,
)
from roll.strategies.weight_sync.writer import GatheredWriter

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")


def segments() -> set[str]:
    return {path.name for path in SHM_DIR.glob(f"{PREFIX}*")}


@pytest.fixture(autouse=True)
def no_leaks():
    before = segments()
    yield
    assert segments() <= before, f"segments left behind: {segments() - before}"


# --- plan -------------------------------------------------------------------------------------------------------
def test_plan_packs_tensors_in_order_into_bounded_aligned_buckets():
    tensors = [
        ("a", torch.zeros(10, dtype=torch.float32)),  # 40 B
        ("b", torch.zeros(3, dtype=torch.bfloat16)),  # 6 B
        ("c", torch.zeros(100, dtype=torch.float32)),  # 400 B
        ("huge", torch.zeros(1000, dtype=torch.float32)),  # 4000 B: a bucket of its own
        ("d", torch.zeros(7, dtype=torch.int64)),
    ]
    plan = build_plan(specs_of(tensors), bucket_bytes=600)
    assert [(b.start, b.stop) for b in plan.buckets] == [(0, 3), (3, 4), (4, 5)]
    assert all(offset % ALIGN == 0 for offset in plan.offsets)
    assert plan.offsets[:3] == (0, 64, 128)
    assert plan.buckets[0].nbytes == 128 + 400 <= 600  # the bound includes the alignment padding
    first = build_plan(specs_of(tensors), 512).buckets[0]
    assert (first.start, first.stop) == (0, 2)
    assert plan.payload == sum(t.numel() * t.element_size() for _, t in tensors)
    assert plan.slot_bytes >= 4000 and plan.slot_bytes % ALIGN == 0
    assert plan.fingerprint == build_plan(specs_of(tensors), 600).fingerprint
    assert plan.fingerprint != build_plan(specs_of(tensors), 4096).fingerprint


def test_slot_views_round_trip_every_dtype_and_shape():
    generator = torch.Generator().manual_seed(0)
    tensors = [
        ("w", torch.randn(4, 6, generator=generator)),
        ("h", torch.randn(5, generator=generator).to(torch.bfloat16)),
        ("i", torch.arange(9, dtype=torch.int32).view(3, 3)),
        ("empty", torch.zeros(0, 4)),
    ]
    plan = build_plan(specs_of(tensors), bucket_bytes=1 << 20)
    slot = torch.zeros(plan.slot_bytes, dtype=torch.uint8)
    views = slot_views(plan, slot)
    assert len(views) == 1
    for (_, view), (_, tensor) in zip(views[0], tensors):
        view.copy_(tensor)
    again = slot_views(plan, slot.clone())  # the same layout read from another copy of the bytes
    for (name, view), (expected_name, tensor) in zip(again[0], tensors):
        assert name == expected_name and view.dtype == tensor.dtype and torch.equal(view, tensor)
    with pytest.raises(ValueError, match="slot"):
        slot_views(plan, torch.zeros(plan.slot_bytes - 1, dtype=torch.uint8))


def test_gathered_writer_copies_named_weights_and_checks_their_order():
    weights = {"a": torch.arange(4.0), "b": torch.ones(2, 2)}
    writer = GatheredWriter(lambda: iter(weights.items()))
    assert [s.name for s in writer.specs] == ["a", "b"]
    out = [torch.zeros(4), torch.zeros(2, 2)]
    stats = writer.write(0, 1, out[:1], local=False)
    stats.add(writer.write(1, 2, out[1:], local=False))
    assert torch.equal(out[0], weights["a"]) and torch.equal(out[1], weights["b"]) and stats.bytes == 32
    with pytest.raises(StrategyError, match="shards"):
        writer.write(0, 1, out[:1], local=True)
    weights = {"b": torch.ones(2, 2), "a": torch.arange(4.0)}  # a backend that changed its order
    with pytest.raises(StrategyError, match="same order"):
        writer.write(0, 1, out[:1], local=False)


# --- ring -------------------------------------------------------------------------------------------------------
def test_ring_size_is_two_slots_and_its_name_goes_once_every_process_mapped_it():
    ring = SharedRing.create(num_writers=1, num_readers=2, slot_bytes=1 << 20)
    try:
        assert ring.path.exists() and ring.name in segments()
        assert len(ring.slots) == 2 and all(s.numel() == 1 << 20 for s in ring.slots)
        assert 2 * (1 << 20) < ring.nbytes <= 2 * (1 << 20) + 64 * 1024  # two slots + a small control block
        other = SharedRing.attach(ring.name)
        ring.slots[1][:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
        assert other.slots[1][:4].tolist() == [1, 2, 3, 4]  # the same pages, no copy
        ring.unlink()
        assert not ring.path.exists()
        other.slots[0][0] = 7
        assert int(ring.slots[0][0]) == 7  # still shared after the name is gone
        other.close()
        with pytest.raises(StrategyError, match="gone"):
            SharedRing.attach(ring.name)
    finally:
        ring.close()
    assert not ring.path.exists()


def _reader(name: str, buckets: int, queue) -> None:
    ring = SharedRing.attach(name)
    ring.join(reader=0)
    seen = []
    for count in range(buckets):
        ring.wait_written(count + 1, timeout_s=300)
        seen.append(int(ring.slots[count % 2][0]))
        ring.publish_read(0, count + 1)
    queue.put(seen)
    ring.close()


def test_ring_hands_buckets_from_a_writer_to_a_reader_process_without_overwriting_unread_slots():
    ctx = mp.get_context("spawn")
    ring = SharedRing.create(num_writers=1, num_readers=1, slot_bytes=4096)
    queue = ctx.Queue()
    reader = spawn_process(_reader, ring.name, 6, queue)
    try:
        ring.join(writer=0)
        for count in range(6):
            # The reader released bucket count - 2 (same slot). Generous: a spawned process importing torch can take
            # over 30 s to start on a loaded machine.
            ring.wait_read(count - 1, timeout_s=300)
            ring.slots[count % 2][0] = 10 + count
            ring.publish_written(0, count + 1)
        assert queue.get(timeout=300) == [10, 11, 12, 13, 14, 15]
    finally:
        reader.join(300)
        ring.close()


def _die_after_join(name: str) -> None:
    ring = SharedRing.attach(name)
    ring.join(reader=0)
    os._exit(3)  # no cleanup, like a killed worker


def test_a_dead_peer_stops_the_wait_quickly_and_an_abort_reaches_every_participant():
    ring = SharedRing.create(num_writers=1, num_readers=1, slot_bytes=4096)
    try:
        ring.join(writer=0)
        process = spawn_process(_die_after_join, ring.name)
        process.join(60)
        ring.publish_written(0, 2)
        began = time.perf_counter()
        with pytest.raises(WeightSyncAborted, match="died"):
            ring.wait_read(1, timeout_s=60)
        assert time.perf_counter() - began < 5
        other = SharedRing.attach(ring.name)
        with pytest.raises(WeightSyncAborted, match="died"):
            other.check()  # the abort (with its message) is visible to everyone
        other.close()
    finally:
        ring.close()


def test_a_wait_times_out_with_a_message():
    ring = SharedRing.create(num_writers=1, num_readers=1, slot_bytes=4096)
    try:
        with pytest.raises(WeightSyncAborted, match="waited"):
            ring.wait_written(1, timeout_s=0.2)
    finally:
        ring.close()


def _create_and_die(conn) -> None:
    ring = SharedRing.create(num_writers=1, num_readers=1, slot_bytes=4096)
    conn.send(ring.name)
    os._exit(0)  # killed between create and unlink: the name stays


def test_a_segment_left_by_a_dead_creator_is_swept_by_the_next_create():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = spawn_process(_create_and_die, child)
    assert parent.poll(120)
    name = parent.recv()
    process.join(60)
    assert (SHM_DIR / name).exists()
    assert name in sweep_stale_segments()
    assert not (SHM_DIR / name).exists()


def test_views_kept_after_close_stay_valid():
    ring = SharedRing.create(num_writers=1, num_readers=1, slot_bytes=4096)
    kept = ring.slots[0][:8]
    kept.fill_(5)
    ring.close()  # an engine that still holds a view keeps the mapping alive, and the name is gone
    assert kept.tolist() == [5] * 8
    assert not ring.path.exists()


# --- routes -----------------------------------------------------------------------------------------------------
def cpu(node: str, pid: int = 1) -> Endpoint:
    return Endpoint(node=node, pid=pid)


def gpu(node: str, uuid: str) -> Endpoint:
    return Endpoint(node=node, pid=1, device="cuda", gpu=uuid)


def test_auto_routes_same_node_receivers_through_the_ring_and_others_by_broadcast():
    routes = plan_routes([cpu("a"), cpu("a")], [cpu("a"), cpu("b"), cpu("a")], "auto", writes_shards=True)
    assert routes.storage == "host" and routes.readers == (0, 2) and routes.broadcast == (1,)
    assert routes.writers == (0, 1) and routes.local_writes and routes.relay and routes.ring_readers == 3
    # Trainers on two nodes cannot share one segment: rank 0 writes what the ranks gather.
    routes = plan_routes([cpu("a"), cpu("b")], [cpu("a")], "auto", writes_shards=True)
    assert routes.writers == (0,) and not routes.local_writes and not routes.relay
    routes = plan_routes([cpu("a"), cpu("a")], [cpu("a")], "auto", writes_shards=False)
    assert routes.writers == (0,) and not routes.local_writes


def test_near_engines_with_one_share_key_read_the_ring_through_their_lowest_rank():
    receivers = [cpu("a"), cpu("a"), cpu("b"), cpu("a"), cpu("a")]
    keys = ["k", "k", "k", None, "other"]
    routes = plan_routes([cpu("a")], receivers, "auto", writes_shards=True, share_keys=keys)
    # Rank 2 is on another node (broadcast), 3 cannot share, 4 has another layout: only 1 follows 0.
    assert routes.shares == ((1, 0),) and routes.readers == (0, 3, 4) and routes.broadcast == (2,)
    assert routes.ring_readers == 4 and routes.leader_of(1) == 0 and routes.followers_of(0) == [1]
    assert "receiver 1 shares receiver 0's weights" in routes.describe()
    # Broadcast receivers and engines on the trainer's GPU keep their own weights.
    assert plan_routes([cpu("a")], receivers[:2], "collective", writes_shards=True, share_keys=keys).shares == ()
    on_gpu = plan_routes([gpu("a", "G0")], [gpu("a", "G0")] * 2, "auto", writes_shards=True, share_keys=["k", "k"])
    assert on_gpu.shares == () and on_gpu.readers == (0, 1)


def test_forced_transports():
    routes = plan_routes([cpu("a")], [cpu("a"), cpu("a")], "collective", writes_shards=True)
    assert routes.readers == () and routes.broadcast == (0, 1)
    with pytest.raises(ConfigError, match=r"workers \[1\]"):
        plan_routes([cpu("a")], [cpu("a"), cpu("b")], "shared_memory", writes_shards=True)
    with pytest.raises(ConfigError, match="transport"):
        plan_routes([cpu("a")], [cpu("a")], "carrier_pigeon", writes_shards=True)


def test_gpu_routes_use_ipc_only_for_engines_on_the_trainer_gpu():
    routes = plan_routes([gpu("a", "G0"), gpu("a", "G1")], [gpu("a", "G0"), gpu("a", "G1")], "auto", writes_shards=True)
    assert routes.storage == "cuda" and routes.readers == (0,) and routes.broadcast == (1,)
    assert routes.writers == (0,) and not routes.local_writes  # other GPUs cannot write into rank 0's slots
    one = plan_routes([gpu("a", "G0")], [gpu("a", "G0")], "auto", writes_shards=True)
    assert one.local_writes and one.readers == (0,) and not one.relay


# --- torn weights -----------------------------------------------------------------------------------------------
class _Strategy:
    device = torch.device("cpu")

    def generate(self) -> str:
        return "tokens"

    def update_weights(self, items) -> str:
        return "loaded"


def test_torn_weights_guard_refuses_compute_but_lets_weight_sync_through():
    guard = TornWeightsGuard(_Strategy(), "sender died")
    with pytest.raises(StrategyError, match="sender died"):
        guard.generate()
    assert guard.update_weights([]) == "loaded"
    assert guard.device == torch.device("cpu")


def test_plan_specs_are_plain_data():
    spec = TensorSpec("x", torch.bfloat16, (3, 5))
    assert spec.numel == 15 and spec.nbytes == 30


# --- shared weights (engines of one node on one copy) -------------------------------------------------------------
def _tied_model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 10, bias=True))
    model[1].weight = model[0].weight  # tied, as embed_tokens and lm_head are
    return model


def test_shared_weights_rebind_engines_to_one_page_aligned_copy(tmp_path):
    leader, follower = _tied_model(), _tied_model()
    values = {name: p.detach().clone() for name, p in leader.named_parameters()}
    key = shared_layout(list(leader.named_parameters()))
    assert key is not None and key == shared_layout(list(follower.named_parameters()))
    assert key[1] % 4096 == 0 and key[1] >= 4096 * 2  # two parameters (the tied one listed once), each on a page
    path = tmp_path / "segment"
    path.write_bytes(bytes(4096 + key[1]))
    adopt_shared_weights(list(leader.named_parameters()), str(path), 4096, fill=True)
    adopt_shared_weights(list(follower.named_parameters()), str(path), 4096, fill=False)
    for name, param in follower.named_parameters():
        assert torch.equal(param, values[name]) and param.data_ptr() % 4096 == 0
    assert follower[1].weight is follower[0].weight
    with torch.no_grad():
        leader[1].bias.add_(1.0)  # a load into the leader is what the follower computes with
    assert torch.equal(follower[1].bias, values["1.bias"] + 1.0)
    # A lone engine's parameters move to page starts with their values.
    lone = _tied_model()
    before = {name: p.detach().clone() for name, p in lone.named_parameters()}
    page_align_parameters(list(lone.named_parameters()))
    assert all(p.data_ptr() % 4096 == 0 and torch.equal(p, before[n]) for n, p in lone.named_parameters())


def test_a_follower_waits_for_the_leader_and_stops_at_its_failures():
    name = f"{PREFIX}test-{os.getpid()}-sw"
    leader = SharedWeights.create(name, followers=1)
    try:
        leader.reserve(8192)
        attached: list[SharedWeights] = []
        waiting = threading.Thread(target=lambda: attached.append(SharedWeights.attach(name, timeout_s=10)))
        waiting.start()  # the follower arrives while the leader is still filling the segment, and waits
        time.sleep(0.3)
        assert not attached
        leader.mark_ready()
        waiting.join(10)
        follower = attached[0]
        follower.mark_attached(0)
        leader.wait_attached(1, timeout_s=5)
        assert not (SHM_DIR / name).exists()  # every engine mapped it: the name is gone
        leader.mark_done(0)
        assert follower.wait_done(0, timeout_s=5) < 1
        leader.mark_failed(1, torn=False)  # failed before its engine loaded anything: old weights, unfenced
        with pytest.raises(StrategyError, match="failed this sync") as failed:
            follower.wait_done(1, timeout_s=5)
        assert not isinstance(failed.value, SharedWeightsTorn)
        leader.mark_failed(2, torn=True)
        with pytest.raises(SharedWeightsTorn, match="failed midway"):
            follower.wait_done(2, timeout_s=5)
        started = time.perf_counter()
        with pytest.raises(StrategyError, match="waited"):
            follower.wait_done(3, timeout_s=0.2)
        assert time.perf_counter() - started < 2
        follower.close()
    finally:
        leader.close()


def test_a_failed_setup_on_either_side_stops_the_other_side_at_once():
    name = f"{PREFIX}test-{os.getpid()}-swf"
    leader = SharedWeights.create(name, followers=1)
    try:
        leader.mark_ready(ok=False)
        started = time.perf_counter()
        with pytest.raises(StrategyError, match="failed to fill"):
            SharedWeights.attach(name, timeout_s=30)
        assert time.perf_counter() - started < 2
    finally:
        leader.close()
    leader = SharedWeights.create(name, followers=2)
    try:
        leader.mark_ready()
        follower = SharedWeights.attach(name, timeout_s=5)
        follower.mark_attached(1, ok=False)
        with pytest.raises(StrategyError, match="follower 1 .* failed to attach"):
            leader.wait_attached(2, timeout_s=30)
        follower.close()
    finally:
        leader.close()
    leader = SharedWeights.create(name, followers=1)
    try:
        with pytest.raises(StrategyError, match="room|GiB"):
            leader.reserve(1 << 60)
    finally:
        leader.close()
