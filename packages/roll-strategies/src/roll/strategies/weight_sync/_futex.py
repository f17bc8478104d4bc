"""Process-shared futex wait/wake on a 32-bit word of a shared mapping (Linux), through ``syscall(2)``.

The ring's waiters sleep in the kernel until a publisher changes the word they watch and wakes them, instead of
polling with sleeps: one wake-up per bucket, issued the moment the bucket is ready. :data:`AVAILABLE` is False
off Linux, on an architecture whose syscall number is not listed, or on a big-endian machine (the ring watches
the low half of an int64 counter); the ring then polls.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["AVAILABLE", "wait", "wake"]

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221, "riscv64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # not FUTEX_PRIVATE_FLAG: the word is shared between processes
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> tuple[object, int] | None:
    if not sys.platform.startswith("linux") or sys.byteorder != "little":
        return None
    number = _SYS_FUTEX.get(platform.machine().lower())
    if number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL while they block
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall, number


_loaded = _load() if os.environ.get("ROLL_WEIGHT_SYNC_FUTEX", "1") != "0" else None
AVAILABLE = _loaded is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at ``address`` equals ``expected`` (low 32 bits), at most ``timeout_s``.

    Returns on a wake, a timeout, a signal, or at once if the word already differs: callers re-check their
    condition in a loop.
    """
    if _loaded is None:
        raise RuntimeError("futex wait is not available on this platform")
    syscall, number = _loaded
    seconds = max(timeout_s, 0.0)
    timeout = _Timespec(int(seconds), int((seconds - int(seconds)) * 1e9))
    syscall(  # type: ignore[operator]
        ctypes.c_long(number),
        ctypes.c_void_p(address),
        ctypes.c_int(_FUTEX_WAIT),
        ctypes.c_uint32(expected & 0xFFFFFFFF),
        ctypes.byref(timeout),
        None,
        ctypes.c_int(0),
    )


def wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``."""
    if _loaded is None:
        return
    syscall, number = _loaded
    syscall(  # type: ignore[operator]
        ctypes.c_long(number), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(_WAKE_ALL)
    )
