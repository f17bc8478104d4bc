"""MessagePack, the part a retrieval server's requests and answers use: nil, booleans, integers, floats, strings,
binary, arrays and maps (no extension types). GEM's retrieval server (``gem.tools.search_engine.retrieval_server``,
the one ROLL's search examples start) speaks it; roll needs no msgpack package for that.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["MsgpackError", "pack", "unpack"]


class MsgpackError(ValueError):
    """Bytes that are not one whole MessagePack value of the supported kinds, or a value that cannot be packed."""


def pack(value: Any) -> bytes:
    out = bytearray()
    _pack(value, out)
    return bytes(out)


def _pack(value: Any, out: bytearray) -> None:
    if value is None:
        out.append(0xC0)
    elif value is True or value is False:
        out.append(0xC3 if value else 0xC2)
    elif isinstance(value, int):
        _pack_int(value, out)
    elif isinstance(value, float):
        out += b"\xcb" + struct.pack(">d", value)
    elif isinstance(value, str):
        data = value.encode()
        _pack_length(len(data), out, fix=(0xA0, 32), sized=(0xD9, 0xDA, 0xDB))
        out += data
    elif isinstance(value, bytes | bytearray):
        _pack_length(len(value), out, fix=None, sized=(0xC4, 0xC5, 0xC6))
        out += value
    elif isinstance(value, list | tuple):
        _pack_length(len(value), out, fix=(0x90, 16), sized=(None, 0xDC, 0xDD))
        for item in value:
            _pack(item, out)
    elif isinstance(value, dict):
        _pack_length(len(value), out, fix=(0x80, 16), sized=(None, 0xDE, 0xDF))
        for key, item in value.items():
            _pack(key, out)
            _pack(item, out)
    else:
        raise MsgpackError(f"cannot pack a {type(value).__name__}")


def _pack_int(value: int, out: bytearray) -> None:
    if 0 <= value < 0x80 or -32 <= value < 0:
        out += struct.pack(">b" if value < 0 else ">B", value)
    elif value >= 0:
        for code, fmt, bound in (
            (0xCC, ">B", 1 << 8),
            (0xCD, ">H", 1 << 16),
            (0xCE, ">I", 1 << 32),
            (0xCF, ">Q", 1 << 64),
        ):
            if value < bound:
                out += bytes([code]) + struct.pack(fmt, value)
                return
        raise MsgpackError(f"integer {value} does not fit 64 bits")
    else:
        for code, fmt, bound in (
            (0xD0, ">b", 1 << 7),
            (0xD1, ">h", 1 << 15),
            (0xD2, ">i", 1 << 31),
            (0xD3, ">q", 1 << 63),
        ):
            if value >= -bound:
                out += bytes([code]) + struct.pack(fmt, value)
                return
        raise MsgpackError(f"integer {value} does not fit 64 bits")


def _pack_length(n: int, out: bytearray, fix: tuple[int, int] | None, sized: tuple[int | None, int, int]) -> None:
    """The header of a string, binary, array or map of ``n`` items: its fix form when short, else 8/16/32-bit."""
    if fix is not None and n < fix[1]:
        out.append(fix[0] | n)
        return
    for code, fmt, bound in zip(sized, (">B", ">H", ">I"), (1 << 8, 1 << 16, 1 << 32), strict=True):
        if code is not None and n < bound:
            out += bytes([code]) + struct.pack(fmt, n)
            return
    raise MsgpackError(f"{n} items are too many for MessagePack")


def unpack(data: bytes) -> Any:
    """The one value ``data`` holds (trailing bytes are an error)."""
    value, end = _unpack(memoryview(data), 0)
    if end != len(data):
        raise MsgpackError(f"{len(data) - end} bytes left after the value")
    return value


# Fixed-width values: type byte -> (struct format, size).
_FIXED = {
    0xCA: (">f", 4),
    0xCB: (">d", 8),
    0xCC: (">B", 1),
    0xCD: (">H", 2),
    0xCE: (">I", 4),
    0xCF: (">Q", 8),
    0xD0: (">b", 1),
    0xD1: (">h", 2),
    0xD2: (">i", 4),
    0xD3: (">q", 8),
}
# Sized values: type byte -> (kind, struct format of the length, its size).
_SIZED = {
    0xD9: ("str", ">B", 1),
    0xDA: ("str", ">H", 2),
    0xDB: ("str", ">I", 4),
    0xC4: ("bin", ">B", 1),
    0xC5: ("bin", ">H", 2),
    0xC6: ("bin", ">I", 4),
    0xDC: ("array", ">H", 2),
    0xDD: ("array", ">I", 4),
    0xDE: ("map", ">H", 2),
    0xDF: ("map", ">I", 4),
}


def _take(data: memoryview, at: int, size: int) -> bytes:
    if at + size > len(data):
        raise MsgpackError(f"the data ends inside a value (byte {at}, {size} more needed)")
    return bytes(data[at : at + size])


def _unpack(data: memoryview, at: int) -> tuple[Any, int]:
    code = _take(data, at, 1)[0]
    at += 1
    if code <= 0x7F:
        return code, at
    if code >= 0xE0:
        return code - 0x100, at
    if code in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[code], at
    if code in _FIXED:
        fmt, size = _FIXED[code]
        return struct.unpack(fmt, _take(data, at, size))[0], at + size
    if 0xA0 <= code <= 0xBF:
        kind, n = "str", code & 0x1F
    elif 0x90 <= code <= 0x9F:
        kind, n = "array", code & 0x0F
    elif 0x80 <= code <= 0x8F:
        kind, n = "map", code & 0x0F
    elif code in _SIZED:
        kind, fmt, size = _SIZED[code]
        n = struct.unpack(fmt, _take(data, at, size))[0]
        at += size
    else:
        raise MsgpackError(f"unsupported MessagePack type byte 0x{code:02x} at byte {at - 1}")
    if kind in ("str", "bin"):
        raw = _take(data, at, n)
        try:
            return (raw.decode() if kind == "str" else raw), at + n
        except UnicodeDecodeError as e:
            raise MsgpackError(f"a string at byte {at} is not UTF-8") from e
    if kind == "array":
        items = []
        for _ in range(n):
            item, at = _unpack(data, at)
            items.append(item)
        return items, at
    mapping = {}
    for _ in range(n):
        key, at = _unpack(data, at)
        value, at = _unpack(data, at)
        try:
            mapping[key] = value
        except TypeError as e:  # an array or map as a key
            raise MsgpackError(f"a map key at byte {at} is not hashable") from e
    return mapping, at
