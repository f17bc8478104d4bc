"""Large concat outputs reuse the memory of freed ones, never memory that something still views."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
import torch

from roll.protocol import DataProto, _tensor_ops
from roll.protocol._tensor_ops import BufferCache


@pytest.fixture
def cache(monkeypatch):
    """A private cache that handles outputs from 1 KiB up (the process-wide one starts at 8 MiB)."""
    fresh = BufferCache(capacity=1 << 20, min_bytes=1 << 10)
    monkeypatch.setattr(_tensor_ops, "_cache", fresh)
    return fresh


def _parts(seed: int, rows: int = 64, parts: int = 4) -> tuple[dict[str, torch.Tensor], list[DataProto]]:
    gen = torch.Generator().manual_seed(seed)
    full = {
        "ids": torch.randint(0, 1000, (rows, 32), generator=gen),
        "logp": torch.randn(rows, 32, generator=gen).to(torch.bfloat16),
    }
    chunks = DataProto.from_dict(full).chunk(parts)
    return full, [p.clone() for p in chunks]


def _address(dp: DataProto, key: str) -> int:
    return dp.batch[key].untyped_storage().data_ptr()


def test_a_freed_output_is_reused_with_the_new_values(cache):
    _, parts = _parts(0)
    first = DataProto.concat(parts)
    address = _address(first, "ids")
    del first
    gc.collect()
    assert cache.cached_bytes > 0

    full2, parts2 = _parts(1)
    second = DataProto.concat(parts2)
    assert _address(second, "ids") == address
    assert cache.reused == 2 and cache.cached_bytes == 0
    for key, value in full2.items():
        assert torch.equal(second.batch[key], value)


@pytest.mark.parametrize(
    "keep",
    [
        lambda dp: dp.chunk(4)[3],  # a DataProto view of some rows
        lambda dp: dp.batch["ids"][5:9],  # a tensor slice
        lambda dp: dp.batch["ids"].numpy(),  # a numpy view
        lambda dp: memoryview(dp.batch["ids"].numpy()),  # a buffer a transport might hold
    ],
    ids=["dataproto-view", "tensor-slice", "numpy", "memoryview"],
)
def test_memory_still_viewed_is_never_handed_out(cache, keep):
    full, parts = _parts(0)
    first = DataProto.concat(parts)
    address = _address(first, "ids")
    survivor = keep(first)
    del first
    gc.collect()

    full2, parts2 = _parts(1)
    second = DataProto.concat(parts2)
    assert _address(second, "ids") != address
    assert torch.equal(second.batch["ids"], full2["ids"])
    # The survivor still reads the first output's values.
    if isinstance(survivor, DataProto):
        assert torch.equal(survivor.batch["ids"], full["ids"][48:])
    else:
        values = torch.as_tensor(np.asarray(survivor))
        assert torch.equal(values, full["ids"][5:9] if values.shape[0] == 4 else full["ids"])


def test_unpickled_copies_do_not_pin_or_share_the_buffer(cache):
    full, parts = _parts(0)
    first = DataProto.concat(parts)
    copy = pickle.loads(pickle.dumps(first, protocol=5))
    del first
    gc.collect()
    assert cache.cached_bytes > 0
    _, parts2 = _parts(1)
    DataProto.concat(parts2)
    for key, value in full.items():
        assert torch.equal(copy.batch[key], value)


def test_capacity_bounds_what_is_kept(monkeypatch):
    # Each output takes a 20 KiB and an 8 KiB buffer: a 30 KiB cache keeps one output's worth.
    small = BufferCache(capacity=30 << 10, min_bytes=1 << 10)
    monkeypatch.setattr(_tensor_ops, "_cache", small)
    outputs = [DataProto.concat(_parts(i)[1]) for i in range(3)]
    del outputs
    gc.collect()
    assert small.cached_bytes == 28 << 10

    off = BufferCache(capacity=0, min_bytes=1 << 10)
    monkeypatch.setattr(_tensor_ops, "_cache", off)
    out = DataProto.concat(_parts(0)[1])
    del out
    gc.collect()
    assert off.cached_bytes == 0 and off.allocated == 0


def test_outputs_of_a_different_size_get_their_own_buffer(cache):
    first = DataProto.concat(_parts(0, rows=64)[1])
    del first
    gc.collect()
    full, parts = _parts(1, rows=1024)
    bigger = DataProto.concat(parts)
    assert cache.reused == 0
    assert torch.equal(bigger.batch["ids"], full["ids"])


def test_bad_cache_size_names_the_variable(monkeypatch):
    monkeypatch.setattr(_tensor_ops, "_cache", None)
    monkeypatch.setenv("ROLL_BUFFER_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="ROLL_BUFFER_CACHE_MB"):
        _tensor_ops.buffer_cache()


def test_read_only_buffers_are_copied_into_recycled_memory(cache):
    """What a Ray worker does with each batch it gets: the copy out of shared memory reuses freed batches."""

    def receive(dp: DataProto) -> DataProto:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
        shared = [memoryview(bytes(b.raw())) for b in buffers]  # read-only, like Ray's object store
        return pickle.loads(data, buffers=shared)

    full, _ = _parts(0)
    first = receive(DataProto.from_dict(full))
    address = _address(first, "ids")
    first.batch["ids"][0, 0] = -1  # writable, and private to this copy
    del first
    gc.collect()

    full2, _ = _parts(1)
    second = receive(DataProto.from_dict(full2))
    assert _address(second, "ids") == address
    for key, value in full2.items():
        assert torch.equal(second.batch[key], value)


def test_row_gathers_use_recycled_memory_too(cache):
    full, _ = _parts(0, rows=256)
    dp = DataProto.from_dict(full)
    index = np.random.default_rng(0).permutation(256)[:128]
    first = dp.select_idxs(index)
    address = _address(first, "ids")
    del first
    gc.collect()
    second = dp.select_idxs(index[::-1].copy())
    assert _address(second, "ids") == address
    for key, value in full.items():
        assert torch.equal(second.batch[key], value[torch.from_numpy(index[::-1].copy())])
