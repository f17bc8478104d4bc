"""roll's MessagePack codec (the retrieval server's wire format): round trips, every width, and msgspec's bytes."""

from __future__ import annotations

import math
import struct

import pytest

from roll.agentic.tools.msgpack_codec import MsgpackError, pack, unpack

VALUES = [
    None,
    True,
    False,
    0,
    127,
    128,
    255,
    256,
    65535,
    65536,
    2**32,
    2**64 - 1,
    -1,
    -32,
    -33,
    -128,
    -129,
    -(2**15) - 1,
    -(2**31) - 1,
    -(2**63),
    0.5,
    -1e300,
    "",
    "é" * 20,
    "x" * 31,
    "x" * 32,
    "y" * 300,
    "z" * 70000,
    b"\x00\xff",
    [],
    list(range(15)),
    list(range(16)),
    list(range(70000)),
    {"query": "capital of France", "topk": 3, "return_scores": True},
    {str(i): i for i in range(16)},
    {"result": [{"document": {"id": "0", "contents": '"Paris"\nParis.'}, "score": 0.25}]},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_round_trip(value) -> None:
    assert unpack(pack(value)) == value


def test_sizes_pick_the_shortest_form() -> None:
    assert pack(5) == b"\x05" and pack(-5) == b"\xfb" and pack(200) == b"\xcc\xc8" and pack(-100) == b"\xd0\x9c"
    assert pack("ab") == b"\xa2ab" and pack("a" * 40)[:2] == b"\xd9\x28" and pack([1]) == b"\x91\x01"
    assert pack({"a": None}) == b"\x81\xa1a\xc0" and pack(1.5) == b"\xcb" + struct.pack(">d", 1.5)


def test_float32_and_errors() -> None:
    assert unpack(b"\xca\x3f\xc0\x00\x00") == 1.5  # a float32, as some servers send scores
    assert math.isnan(unpack(pack(float("nan"))))
    with pytest.raises(MsgpackError, match="ends inside a value"):
        unpack(b"\xa5ab")
    with pytest.raises(MsgpackError, match="bytes left"):
        unpack(b"\x01\x02")
    with pytest.raises(MsgpackError, match="type byte 0xc7"):
        unpack(b"\xc7\x01\x01\x00")  # ext 8: not supported
    with pytest.raises(MsgpackError, match="cannot pack a set"):
        pack({1, 2})
    with pytest.raises(MsgpackError, match="64 bits"):
        pack(2**64)


def test_agrees_with_msgspec() -> None:
    msgspec = pytest.importorskip("msgspec")  # gem-llm's dependency (GEM's SearchTool packs with it)
    for value in VALUES:
        if isinstance(value, bytes):
            continue  # msgspec decodes bin as bytes too, but encodes bytes as bin: same either way below
        assert pack(value) == msgspec.msgpack.encode(value)
        assert unpack(msgspec.msgpack.encode(value)) == value
    assert unpack(msgspec.msgpack.encode(b"\x00\xff")) == b"\x00\xff"
