"""The copies of a weight sync without Ray or vLLM: memmove copies, the worker environment, futex waits, more than
two ring slots, and the replayed in-place loads of ``roll.strategies.vllm._replay`` on a toy model whose
``load_weights`` fills fused slices the way vLLM's loaders do."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from roll.strategies.vllm._replay import ReplayCache
from roll.strategies.weight_sync import TensorSpec, build_plan, weight_sync_env
from roll.strategies.weight_sync.memcopy import (
    ALIAS_BAND,
    CopyCounts,
    aliased,
    memmove_calls,
    run_memmoves,
    streaming_threshold,
)
from roll.strategies.weight_sync.ring import SHM_DIR, SharedRing
from roll.strategies.weight_sync.sender import MAX_HOST_SLOTS, host_slots
from roll.strategies.weight_sync.writer import copy_into


# --- copies and environment ---------------------------------------------------------------------------------------
def test_copy_into_copies_plain_casts_and_strided_pairs():
    src = [torch.randn(3, 5), torch.randn(4, 6).t(), torch.randn(7, dtype=torch.float64)]
    dst = [torch.empty(3, 5), torch.empty(6, 4), torch.empty(7, dtype=torch.float32)]
    assert copy_into(dst, src) == (15 + 24 + 7) * 4
    for d, s in zip(dst, src):
        assert torch.equal(d, s.to(d.dtype))
    plain_src, plain_dst = [torch.arange(10.0), torch.arange(4, dtype=torch.int64)], [torch.empty(10), torch.empty(4)]
    plain_dst[1] = torch.empty(4, dtype=torch.int64)
    assert copy_into(plain_dst, plain_src) == 10 * 4 + 4 * 8
    assert all(torch.equal(d, s) for d, s in zip(plain_dst, plain_src))


def test_weight_sync_env_sets_the_threshold_once_and_keeps_other_tunables():
    assert weight_sync_env({}) == {"GLIBC_TUNABLES": "glibc.cpu.x86_non_temporal_threshold=0x100000"}
    env = weight_sync_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.cpu.x86_non_temporal_threshold=0x100000"}
    assert weight_sync_env({"GLIBC_TUNABLES": "glibc.cpu.x86_non_temporal_threshold=0xc000000"}) == {}


def test_streaming_threshold_reads_the_tunable_weight_sync_env_sets():
    assert streaming_threshold(weight_sync_env({})) == 1 << 20
    assert (
        streaming_threshold({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.cpu.x86_non_temporal_threshold=0x4040"})
        == 0x4040
    )
    assert streaming_threshold({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is None
    assert streaming_threshold({}) is None


def test_only_a_destination_a_little_ahead_of_its_source_within_a_page_counts_as_aliased():
    base = 1 << 30
    assert [aliased(base + delta, base) for delta in (0, 1, 64, ALIAS_BAND - 1, ALIAS_BAND, 2048, 4095)] == [
        False,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert aliased(base + 4096 * 7 + 64, base) and not aliased(base, base + 64)  # pages apart; source ahead


def test_a_large_aliased_pair_is_copied_in_pieces_below_the_threshold_and_others_whole():
    counts = CopyCounts()
    base, piece = 1 << 30, 1 << 19
    pairs = [
        (base + 64, base + (8 << 20), 3 * piece + 100),
        (base + 2048, base + (16 << 20), 3 * piece),
        (base + 64, base, piece),
    ]
    calls = memmove_calls(pairs, piece=piece, counts=counts)
    assert calls[:4] == [
        (base + 64 + i * piece, base + (8 << 20) + i * piece, piece if i < 3 else 100) for i in range(4)
    ]
    assert calls[4:] == pairs[1:]
    assert (counts.whole, counts.split, counts.bytes) == (2, 1, sum(n for _, _, n in pairs))


def test_copy_into_copies_an_aliased_pair_in_pieces_byte_for_byte():
    src_buffer, dst_buffer = torch.randn((3 << 20) // 4 + 4096), torch.zeros((3 << 20) // 4 + 4096)
    src = src_buffer[: (3 << 20) // 4]
    shift = ((src.data_ptr() - dst_buffer.data_ptr() + 64) % 4096) // 4  # dst lands 64 bytes ahead (mod 4 KiB)
    dst = dst_buffer[shift : shift + src.numel()]
    assert aliased(dst.data_ptr(), src.data_ptr()) and (dst.data_ptr() - src.data_ptr()) % 4096 == 64
    assert len(memmove_calls([(dst.data_ptr(), src.data_ptr(), src.numel() * 4)])) > 1
    assert copy_into([dst], [src]) == src.numel() * 4
    assert torch.equal(dst, src) and not dst_buffer[:shift].any() and not dst_buffer[shift + src.numel() :].any()
    assert run_memmoves([]) == 0


# --- ring -------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")
def test_a_waiter_sleeps_until_the_publish_and_a_ring_can_have_more_slots():
    ring = SharedRing.create(num_writers=1, num_readers=1, slot_bytes=4096, num_slots=3)
    try:
        assert ring.num_slots == 3 and len(ring.slots) == 3
        assert ring.nbytes >= 3 * 4096
        publisher = threading.Timer(0.3, ring.publish_written, args=(0, 1))
        publisher.start()
        cpu = time.process_time()
        waited = ring.wait_written(1, 10.0)
        publisher.join()
        assert 0.2 < waited < 5.0
        assert time.process_time() - cpu < 0.1  # slept, did not spin
        assert ring.written() == 1
    finally:
        ring.close()


def test_host_rings_get_up_to_four_slots_within_the_byte_budget():
    def plan(buckets: int, mib: int):
        specs = [TensorSpec(f"t{i}", torch.uint8, (mib << 20,)) for i in range(buckets)]
        return build_plan(specs, mib << 20)

    assert host_slots(plan(1, 64)) == 2
    assert host_slots(plan(3, 64)) == 3
    assert host_slots(plan(8, 64)) == MAX_HOST_SLOTS
    assert host_slots(plan(8, 512)) == 2  # 1 GiB budget: two 512 MiB slots, and never fewer than two


# --- replayed in-place loads --------------------------------------------------------------------------------------
class _Fused(nn.Module):
    """q/k/v stacked in one parameter and a plain norm, loaded like vLLM's QKV and default weight loaders."""

    def __init__(self, mode: str = "copy") -> None:
        super().__init__()
        self.qkv = nn.Parameter(torch.zeros(8, 4))
        self.norm = nn.Parameter(torch.zeros(4))
        self.mode = mode
        self.calls = 0

    def load_weights(self, weights):
        self.calls += 1
        loaded = set()
        for name, tensor in weights:
            if name in ("q", "k", "v"):
                start, size = {"q": (0, 4), "k": (4, 2), "v": (6, 2)}[name]
                self.qkv.data.narrow(0, start, size).copy_(tensor)
                loaded.add("qkv")
                continue
            loaded.add("norm")
            if self.mode == "scaled":
                self.norm.data.copy_(tensor)
                self.norm.data.mul_(2)
            elif self.mode == "computed":
                self.norm.data.copy_(tensor + 1)
            elif self.mode == "out":
                torch.add(tensor, 1, out=self.norm.data)
            elif self.mode == "alternating":  # a different destination every sync
                self.norm.data.copy_(tensor if self.calls % 2 else tensor.flip(0))
            else:
                self.norm.data.copy_(tensor)
        return loaded


def _bucket(seed: int, names=("q", "k", "v", "norm")) -> list[tuple[str, torch.Tensor]]:
    slot = torch.randn(64, generator=torch.Generator().manual_seed(seed))  # one flat slot, views like a sync's
    views = {"q": slot[:16].view(4, 4), "k": slot[16:24].view(2, 4), "v": slot[24:32].view(2, 4), "norm": slot[32:36]}
    return [(name, views[name]) for name in names]


def _load(cache: ReplayCache, model: _Fused, bucket: list[tuple[str, torch.Tensor]]) -> list[str]:
    return cache.load(model, bucket, lambda tensors: sorted(model.load_weights(iter(tensors))))


def test_replay_copies_the_same_bytes_as_load_weights_once_two_recordings_agree():
    model, cache = _Fused(), ReplayCache()
    for seed in range(4):
        bucket = _bucket(seed)
        assert _load(cache, model, bucket) == ["norm", "qkv"]
        assert torch.equal(model.qkv.data, torch.cat([bucket[0][1], bucket[1][1], bucket[2][1]]))
        assert torch.equal(model.norm.data, bucket[3][1])
    assert model.calls == 2  # recorded twice, replayed twice
    assert cache.counts() == (1, 0)
    # Every replayed copy (q, k, v, norm; twice) was one plain memmove, none torch's copy_.
    assert (cache.memmoves.whole, cache.memmoves.split, cache.torch_copies) == (8, 0, 0)


class _Big(nn.Module):
    """One 1 MiB parameter loaded by plain copy_: large enough that an aliased replay is split into pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1 << 18))

    def load_weights(self, weights):
        for _, tensor in weights:
            self.weight.data.copy_(tensor)
        return {"weight"}


def test_a_replayed_copy_whose_addresses_alias_is_split_and_still_exact():
    model, cache = _Big(), ReplayCache()
    slot = torch.empty((1 << 18) + 4096)
    shift = ((model.weight.data_ptr() - slot.data_ptr() - 64) % 4096) // 4  # the parameter 64 bytes ahead
    for seed in range(3):
        view = slot[shift : shift + (1 << 18)]
        view.copy_(torch.randn(1 << 18, generator=torch.Generator().manual_seed(seed)))
        assert aliased(model.weight.data_ptr(), view.data_ptr())
        assert cache.load(model, [("weight", view)], lambda tensors: sorted(model.load_weights(tensors))) == ["weight"]
        assert torch.equal(model.weight.data, view)
    assert cache.counts() == (1, 0) and (cache.memmoves.whole, cache.memmoves.split, cache.torch_copies) == (0, 1, 0)


def test_buckets_that_fill_part_of_a_fused_parameter_replay_their_part():
    model, cache = _Fused(), ReplayCache()
    for seed in range(3):
        first, second = _bucket(seed, ("q", "k")), _bucket(seed + 10, ("v", "norm"))
        _load(cache, model, first)
        _load(cache, model, second)
        assert torch.equal(model.qkv.data, torch.cat([first[0][1], first[1][1], second[0][1]]))
    assert model.calls == 4 and cache.counts() == (2, 0)


@pytest.mark.parametrize("mode", ["scaled", "computed", "out", "alternating"])
def test_a_load_that_is_not_the_same_plain_copies_always_goes_through_load_weights(mode):
    model, cache = _Fused(mode), ReplayCache()
    for seed in range(4):
        bucket = _bucket(seed)
        _load(cache, model, bucket)
        norm = bucket[3][1]
        expected = {"scaled": norm * 2, "computed": norm + 1, "out": norm + 1}.get(mode)
        if mode == "alternating":
            expected = norm if model.calls % 2 else norm.flip(0)
        assert torch.allclose(model.norm.data, expected)
    assert model.calls == 4 and cache.counts() == (0, 1)


def test_a_moved_parameter_is_recorded_again():
    model, cache = _Fused(), ReplayCache()
    _load(cache, model, _bucket(0))
    _load(cache, model, _bucket(1))
    model.qkv.data = torch.zeros(8, 4)  # new memory: the recorded views would write the old one
    bucket = _bucket(2)
    _load(cache, model, bucket)
    assert model.calls == 3
    assert torch.equal(model.qkv.data[:4], bucket[0][1])
    _load(cache, model, _bucket(3))
    _load(cache, model, bucket := _bucket(4))
    assert model.calls == 4
    assert torch.equal(model.qkv.data[:4], bucket[0][1])


def test_a_parameter_moved_between_the_two_recordings_starts_them_over():
    model, cache = _Fused(), ReplayCache()
    _load(cache, model, _bucket(0))  # first recording
    model.qkv.data = torch.zeros(8, 4)  # moved before the second (as engines re-bound to shared weights are)
    for seed in range(1, 5):
        bucket = _bucket(seed)
        _load(cache, model, bucket)
        assert torch.equal(model.qkv.data[:4], bucket[0][1])
    assert model.calls == 3 and cache.counts() == (1, 0)  # recorded again twice, then replayed
