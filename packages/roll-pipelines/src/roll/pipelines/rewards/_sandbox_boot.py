"""Bootstrap that runs inside the sandboxed interpreter before the untrusted program (stdlib only).

:mod:`roll.pipelines.rewards.sandbox` passes this file's source to ``python -I -S -c`` with a JSON config as
``argv[1]``. It reads the program from an inherited file descriptor (the program is never a file the sandbox
could find), installs a seccomp filter (kernel-enforced: no fork/exec, no non-unix sockets, no signals to other
processes, no namespace/ptrace/bpf/io_uring syscalls), installs an audit hook (in-process, bypassable: see the
sandbox module docstring), then executes the program as ``__main__``. It reports why it stopped the program
with a marker line on stderr and a reserved exit code, which the parent turns into a status.
"""

from __future__ import annotations

import builtins
import json
import linecache
import os
import struct
import sys
import traceback

MARKER = "@@roll-sandbox@@"
EXIT_BLOCKED = 97
EXIT_MEMORY = 98
EXIT_FILE_LIMIT = 99

# --- seccomp ------------------------------------------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Syscalls refused with EPERM outright, per architecture (aarch64 has no fork/vfork: glibc uses clone).
_DENIED = {
    "x86_64": {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101, "tkill": 200, "unshare": 272,
        "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "keyctl": 250,
        "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "process_vm_readv": 310,
        "process_vm_writev": 311, "pidfd_send_signal": 424, "kexec_load": 246, "init_module": 175,
        "finit_module": 313, "personality": 135,
    },
    "aarch64": {
        "execve": 221, "execveat": 281, "ptrace": 117, "tkill": 130, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_send_signal": 424,
        "kexec_load": 104, "init_module": 105, "finit_module": 273, "personality": 92,
    },
}  # fmt: skip
# Syscalls whose first argument decides: clone (thread or process), socket (domain), kill/tgkill (target pid).
_CHECKED = {
    "x86_64": {"clone": 56, "clone3": 435, "socket": 41, "kill": 62, "tgkill": 234},
    "aarch64": {"clone": 220, "clone3": 435, "socket": 198, "kill": 129, "tgkill": 131},
}
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_RET_EPERM, _RET_ENOSYS = 0x00050000 | 1, 0x00050000 | 38
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_CLONE_THREAD, _AF_UNIX = 0x10000, 1


def seccomp_program(machine: str, pid: int) -> bytes | None:
    """The BPF program (``struct sock_filter[]``) for ``machine``, or None for an unsupported architecture.

    ``pid`` is the only process ``kill``/``tgkill`` may target (besides 0, its own process group).
    """
    if machine not in _AUDIT_ARCH:
        return None
    checked = _CHECKED[machine]
    code: list[tuple[int, object, object, int]] = [(_LD_ABS, 0, 0, 4), (_JEQ, 0, "kill", _AUDIT_ARCH[machine])]
    code.append((_LD_ABS, 0, 0, 0))
    if machine == "x86_64":
        code.append((_JGE, "deny", 0, 0x40000000))  # x32 ABI numbers alias the 64-bit ones
    code += [(_JEQ, "deny", 0, nr) for nr in _DENIED[machine].values()]
    code += [
        (_JEQ, "enosys", 0, checked["clone3"]),  # glibc then falls back to clone(), which we can inspect
        (_JEQ, "clone", 0, checked["clone"]),
        (_JEQ, "socket", 0, checked["socket"]),
        (_JEQ, "signal", 0, checked["kill"]),
        (_JEQ, "signal", 0, checked["tgkill"]),
        (_RET, 0, 0, _RET_ALLOW),
    ]
    labels = {"clone": len(code)}
    code += [(_LD_ABS, 0, 0, 16), (_JSET, "allow", "deny", _CLONE_THREAD)]
    labels["socket"] = len(code)
    code += [(_LD_ABS, 0, 0, 16), (_JEQ, "allow", "deny", _AF_UNIX)]
    labels["signal"] = len(code)
    code += [(_LD_ABS, 0, 0, 16), (_JEQ, "allow", 0, pid), (_JEQ, "allow", "deny", 0)]
    for name, ret in (("allow", _RET_ALLOW), ("deny", _RET_EPERM), ("enosys", _RET_ENOSYS), ("kill", _RET_KILL)):
        labels[name] = len(code)
        code.append((_RET, 0, 0, ret))
    out = bytearray()
    for index, (op, jt, jf, k) in enumerate(code):
        jt_off = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf_off = labels[jf] - index - 1 if isinstance(jf, str) else jf
        out += struct.pack("=HBBI", op, jt_off, jf_off, k)
    return bytes(out)


def install_seccomp() -> None:
    """Load the filter into this process (needs no_new_privs, which the parent set before exec)."""
    import ctypes

    program = seccomp_program(os.uname().machine, os.getpid())
    if program is None:
        raise OSError(f"seccomp filter not available for {os.uname().machine}")

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    # Forget ctypes so that the program's own `import ctypes` is a fresh import the audit hook refuses.
    for name in [n for n in sys.modules if n in ("ctypes", "_ctypes") or n.startswith("ctypes.")]:
        del sys.modules[name]


# --- audit hook ----------------------------------------------------------------------------------------------
_PROCESS_EVENTS = frozenset(
    {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg"}
    | {"subprocess.Popen", "pty.spawn", "os.startfile"}
)
_NATIVE_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})
_INTROSPECTION_EVENTS = frozenset({"gc.get_referrers", "gc.get_referents", "gc.get_objects", "sys.addaudithook"})
_WRITE_EVENTS = frozenset(
    {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink"}
    | {"os.truncate", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr", "shutil.chown"}
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _deny(reason: str) -> None:
    os.write(2, f"\n{MARKER} blocked: {reason}\n".encode(errors="replace"))
    os._exit(EXIT_BLOCKED)


def make_audit_hook(workdir: str, read_roots: list[str], block_native: bool = True):
    """The hook: network, processes, native code (if ``block_native``) and file access outside
    ``workdir``/``read_roots`` end the run."""
    write_roots = (workdir, "/dev/null")
    readable = (workdir, *read_roots)

    def under(path: object, roots: tuple[str, ...]) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor
        text = os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else "."
        full = os.path.realpath(os.path.join(os.getcwd(), text))
        return any(full == root or full.startswith(root.rstrip("/") + "/") for root in roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = bool(flags & _WRITE_FLAGS) if mode is None else any(c in str(mode) for c in "wax+")
            if not under(path, write_roots if writing else readable):
                _deny(f"filesystem ({'write' if writing else 'open'} {os.fsdecode(os.fspath(path))!r})")
        elif event.startswith("socket."):
            _deny(f"network ({event})")
        elif event in _PROCESS_EVENTS and not (event == "os.kill" and args[0] == os.getpid()):
            _deny(f"process ({event})")
        elif block_native and (
            event.startswith("ctypes.") or (event == "import" and args[0].split(".")[0] in _NATIVE_MODULES)
        ):
            _deny(f"native code ({event} {args[0] if event == 'import' else ''})".replace(" )", ")"))
        elif event in _INTROSPECTION_EVENTS:
            _deny(f"introspection ({event})")
        elif event in ("os.listdir", "os.scandir"):
            if not under(args[0], readable):
                _deny(f"filesystem (list {args[0]!r})")
        elif event in _WRITE_EVENTS:
            paths = [args[0]] + ([args[1]] if event in ("os.rename", "os.link", "os.symlink") else [])
            if event == "os.symlink":
                paths = [args[1]]  # the link's target may be anything; where it is created matters
            if not all(under(p, write_roots) for p in paths):
                _deny(f"filesystem ({event} {args[0]!r})")

    return hook


# --- running the program ---------------------------------------------------------------------------------------
def _stop_for(exc: BaseException) -> tuple[int, str] | None:
    """A reserved exit code and reason for failures the sandbox caused, None for the program's own errors."""
    if isinstance(exc, MemoryError):
        return EXIT_MEMORY, "memory limit"
    if isinstance(exc, OSError) and exc.errno in (27, 28):  # EFBIG (RLIMIT_FSIZE), ENOSPC (tmpfs quota)
        return EXIT_FILE_LIMIT, "file size limit" if exc.errno == 27 else "disk quota exceeded"
    if isinstance(exc, PermissionError):
        return EXIT_BLOCKED, f"permission denied ({exc})"
    if isinstance(exc, OSError) and exc.errno in (100, 101, 113):  # ENETDOWN, ENETUNREACH, EHOSTUNREACH
        return EXIT_BLOCKED, f"network ({exc})"
    return None


def run_program(source: str) -> None:
    """Execute ``source`` as ``__main__``; report sandbox-caused failures with a marker and a reserved exit code."""
    linecache.cache["main.py"] = (len(source), None, source.splitlines(True), "main.py")
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": "main.py"}
    sys.argv = ["main.py"]
    try:
        exec(compile(source, "main.py", "exec"), namespace)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        stop = _stop_for(exc)
        try:
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
            sys.stderr.flush()
        except MemoryError:
            pass
        if stop is not None:
            sys.stdout.flush()
            prefix = "blocked: " if stop[0] == EXIT_BLOCKED else ""
            os.write(2, f"\n{MARKER} {prefix}{stop[1]}\n".encode(errors="replace"))
            os._exit(stop[0])
        sys.exit(1)


def main() -> None:
    config = json.loads(sys.argv[1])
    with os.fdopen(config["code_fd"], "rb") as f:
        source = f.read().decode("utf-8", errors="replace")
    if config["seccomp"]:
        install_seccomp()
    if config["audit_hook"]:
        sys.addaudithook(make_audit_hook(config["workdir"], config["read_roots"], config["block_native"]))
    if config.get("self_test"):
        print("roll-sandbox-ok")
        return
    run_program(source)


if __name__ == "__main__":
    main()
