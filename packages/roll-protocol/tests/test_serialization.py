from __future__ import annotations

import pickle

import numpy as np
import torch

from roll.protocol import DataProto
from roll.protocol.testing import assert_dataproto_equal


def _roundtrip_out_of_band(dp: DataProto) -> tuple[DataProto, list[pickle.PickleBuffer], bytes]:
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(stream, buffers=buffers), buffers, stream


def test_out_of_band_pickling_keeps_bytes_out_of_the_stream():
    ids = torch.arange(64 * 256, dtype=torch.int64).reshape(64, 256)
    text = [f"row {i} " + "x" * 500 for i in range(64)]
    dp = DataProto.from_dict({"ids": ids, "lp": torch.randn(64, 256)}, {"text": text}, {"step": 1})
    restored, buffers, stream = _roundtrip_out_of_band(dp)
    assert_dataproto_equal(restored, dp)
    assert restored.meta_info == {"step": 1}
    payload = ids.numel() * 8 + 64 * 256 * 4 + sum(len(t) for t in text)
    assert len(stream) < 4096 < payload
    assert sum(memoryview(b).nbytes for b in buffers) >= payload


def test_in_band_pickling_round_trips_at_every_protocol(mixed):
    for protocol in (2, 4, 5):
        restored = pickle.loads(pickle.dumps(mixed, protocol=protocol))
        assert_dataproto_equal(restored, mixed)


def test_a_chunk_ships_only_its_own_rows():
    dp = DataProto.from_dict({"ids": torch.zeros(1000, 100, dtype=torch.int64)}, {"text": ["y" * 1000] * 1000})
    part = dp.chunk(10)[3]
    _, buffers, _ = _roundtrip_out_of_band(part)
    shipped = sum(memoryview(b).nbytes for b in buffers)
    own = 100 * 100 * 8 + 100 * 1000
    assert own <= shipped < own * 1.2


def test_unusual_dtypes_and_empty_tensors_survive():
    dp = DataProto.from_dict(
        {
            "bf16": torch.randn(3, 5).to(torch.bfloat16),
            "half": torch.randn(3, 2).half(),
            "flags": torch.tensor([True, False, True]),
            "empty": torch.zeros(3, 0),
            "strided": torch.arange(30).reshape(3, 10)[:, ::2],
        }
    )
    for restored in (_roundtrip_out_of_band(dp)[0], pickle.loads(pickle.dumps(dp))):
        assert_dataproto_equal(restored, dp)


def test_read_only_buffers_are_copied_so_edits_stay_private():
    dp = DataProto.from_dict({"x": torch.arange(4)})
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    shared = [memoryview(bytes(b.raw())) for b in buffers]  # read-only, like Ray's shared-memory store
    restored = pickle.loads(stream, buffers=shared)
    restored.batch["x"][0] = 42
    again = pickle.loads(stream, buffers=shared)
    assert again["x"].tolist() == [0, 1, 2, 3]


def test_writable_buffers_are_used_without_copying():
    dp = DataProto.from_dict({"x": torch.arange(1000)})
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    backing = bytearray(buffers[0].raw())
    restored = pickle.loads(stream, buffers=[backing])
    assert restored["x"].data_ptr() == np.frombuffer(backing, dtype=np.uint8).ctypes.data
