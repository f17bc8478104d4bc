"""Linux isolation primitives used by :mod:`roll.pipelines.rewards.sandbox` (parent side), via ctypes.

Everything here is called either in the parent (building a Landlock ruleset, probing) or in the forked child
between ``fork`` and ``exec`` (``preexec_fn``). Code that runs in the child must not import, log or take locks
another thread may hold, so the libc symbols are resolved once at import time and the child only calls them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterable

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "LandlockRuleset",
    "drop_capability_bounding_set",
    "landlock_abi",
    "last_capability",
    "make_mounts_private",
    "map_own_ids",
    "mount_tmpfs",
    "set_no_new_privs",
    "set_parent_death_signal",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38

# Landlock syscall numbers are the same on every architecture (they were added after the unified table).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Filesystem access rights, by the ABI version that introduced them.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
_FS_ABI1_ALL = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_CONNECT_TCP = 0b11  # ABI 4
_SCOPE_ABSTRACT_UNIX_AND_SIGNAL = 0b11  # ABI 6

_libc_path = ctypes.util.find_library("c")
_libc = ctypes.CDLL(_libc_path, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def unshare(flags: int) -> None:
    """Move the calling process into new namespaces (``CLONE_*`` flags)."""
    _check(_unshare(flags), "unshare")


def make_mounts_private() -> None:
    """Stop mount events in this (new) mount namespace from propagating back to the host's."""
    _check(_mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")


def mount_tmpfs(target: bytes, size_bytes: int, uid: int, gid: int) -> None:
    """Mount a size-capped tmpfs on ``target`` (a disk quota for the sandbox's working directory)."""
    options = f"size={size_bytes},nr_inodes=4096,mode=0700,uid={uid},gid={gid}".encode()
    _check(_mount(b"tmpfs", target, b"tmpfs", _MS_NOSUID | _MS_NODEV, options), "mount tmpfs")


def set_no_new_privs() -> None:
    """Forbid gaining privileges through exec (set-uid binaries, file capabilities); Landlock/seccomp need it."""
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def set_parent_death_signal(signum: int) -> None:
    """Deliver ``signum`` to this process when the thread that spawned it dies (no orphaned sandboxes)."""
    _check(_prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def last_capability() -> int:
    """The highest capability number this kernel knows."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 40


def drop_capability_bounding_set(last_cap: int) -> None:
    """Empty the capability bounding set, so that a uid-0 process holds no capability after its next exec."""
    for cap in range(last_cap + 1):
        _check(_prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")


def landlock_abi() -> int:
    """The Landlock ABI version the kernel offers, or 0 when Landlock is absent or disabled."""
    result = _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(result), 0)


class LandlockRuleset:
    """A Landlock ruleset: everything it handles is denied except what :meth:`allow` grants.

    Built in the parent; the child adds its working directory (which may be a fresh tmpfs only it sees) and
    calls :meth:`restrict_self` just before exec. ABI 4+ also denies every TCP bind/connect, ABI 6+ scopes
    signals and abstract unix sockets to the sandbox.
    """

    def __init__(self, abi: int) -> None:
        if abi < 1:
            raise OSError("Landlock is not available on this kernel")
        self.abi = abi
        fs = _FS_ABI1_ALL
        if abi >= 2:
            fs |= _FS_REFER
        if abi >= 3:
            fs |= _FS_TRUNCATE
        if abi >= 5:
            fs |= _FS_IOCTL_DEV
        self.handled_fs = fs
        net = _NET_BIND_CONNECT_TCP if abi >= 4 else 0
        scoped = _SCOPE_ABSTRACT_UNIX_AND_SIGNAL if abi >= 6 else 0
        attr = struct.pack("=QQQ", fs, net, scoped)[: 8 if abi < 4 else (16 if abi < 6 else 24)]
        buf = ctypes.create_string_buffer(attr, len(attr))
        self.fd = _check(int(_syscall(_SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), 0)), "landlock")
        self.denies_tcp = bool(net)
        self.scopes_signals = bool(scoped)

    def allow(self, path: str | bytes, rights: int) -> None:
        """Grant ``rights`` on ``path`` and (for a directory) everything beneath it. Missing paths are skipped."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            if not os.path.isdir(f"/proc/self/fd/{fd}"):
                rights &= _FILE_ONLY_RIGHTS  # the kernel rejects directory rights on a file
            rule = struct.pack("=Qi", rights & self.handled_fs, fd)
            buf = ctypes.create_string_buffer(rule, len(rule))
            _check(int(_syscall(_SYS_LANDLOCK_ADD_RULE, self.fd, _LANDLOCK_RULE_PATH_BENEATH, buf, 0)), "landlock rule")
        finally:
            os.close(fd)

    def allow_read(self, paths: Iterable[str]) -> None:
        for path in paths:
            self.allow(path, FS_READ_FILE | FS_READ_DIR | FS_EXECUTE)

    def allow_all(self, path: str | bytes) -> None:
        self.allow(path, self.handled_fs)

    def restrict_self(self) -> None:
        """Enforce the ruleset on the calling process and its future children (needs no_new_privs first)."""
        _check(int(_syscall(_SYS_LANDLOCK_RESTRICT_SELF, self.fd, 0)), "landlock_restrict_self")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def map_own_ids(uid: int, gid: int) -> None:
    """In a fresh user namespace, map the caller's outer ``uid``/``gid`` to themselves (nothing else is mapped).

    Without a mapping the process could not own files on the tmpfs it mounts.
    """
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
