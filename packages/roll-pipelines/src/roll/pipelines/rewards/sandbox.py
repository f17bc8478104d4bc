"""Run untrusted Python (model-generated code) in a contained subprocess: :func:`run_untrusted`.

Each call runs ``sys.executable -I -S`` (isolated mode, no site-packages unless ``site_packages=True``) in a new
session, in a fresh temporary working directory that is deleted afterwards, with a minimal environment (no
inherited variables, so no secrets). The program reaches the interpreter through an inherited memfd, never as a
file. Layers, strongest first; the kernel ones are probed once per process (:func:`sandbox_layers` says what this
machine got) and a layer that does not work here is left out, with a log line:

Always active
    * **rlimits** set in the child before exec: ``RLIMIT_CPU`` (``cpu_s``; SIGXCPU, then SIGKILL a second later),
      ``RLIMIT_AS`` (``memory_mb``: large allocations raise MemoryError), ``RLIMIT_FSIZE`` (``max_file_mb``),
      ``RLIMIT_NOFILE``, ``RLIMIT_CORE=0`` and ``RLIMIT_NPROC`` (note: the kernel never applies NPROC to uid 0).
    * **wall clock**: after ``timeout_s`` the whole process group is SIGKILLed (it is also killed after every
      normal exit, so nothing the program left behind survives); stdout+stderr are capped at
      ``max_output_bytes``; ``no_new_privs`` and a parent-death signal are set.
Probed kernel layers (on by default where available)
    * **namespaces**: new network (only a down loopback: no network at all), IPC, UTS and mount namespaces:
      ``unshare`` as root, or inside a new user namespace otherwise.
    * **disk quota**: the working directory is a private tmpfs of ``disk_mb`` (needs the mount namespace).
    * **privileges**: as root, the child switches to uid/gid 65534 ("nobody") when that user can run the
      interpreter; otherwise it stays uid 0 with an empty capability bounding set (no capabilities after exec;
      file permissions then do not protect root-owned files: Landlock does).
    * **Landlock** (ABI >= 1): read/execute only on the interpreter, its stdlib, libpython and the system library
      dirs,
      read/write only in the working directory; ABI >= 4 also denies every TCP bind/connect, ABI >= 6 keeps
      signals and abstract unix sockets inside the sandbox.
    * **seccomp** (x86_64, aarch64; installed by the bootstrap right before the program runs): fork/vfork,
      clone without CLONE_THREAD, execve, sockets other than AF_UNIX, signals to other processes, ptrace,
      namespaces, mount, bpf, io_uring, keyrings and module loading fail with EPERM; foreign-ABI syscalls kill.
In-process layer (defence in depth only)
    * **audit hook** (``sys.addaudithook``, ``audit_hook=True``): socket use, subprocess/os.system/exec/spawn/fork/
      kill, ctypes/cffi, gc referrer walks, and file access outside the working directory (reads are allowed in
      the read-only roots above) end the program with status ``blocked``. Audit hooks are bypassable by
      determined code (e.g. C extensions or tampering with the hook's state); the kernel layers are the boundary.
      With ``site_packages=True`` ctypes/cffi are allowed (packages such as numpy load them on import).

Known limits: no cgroup is used, so memory is bounded per address space (RLIMIT_AS: raise ``memory_mb`` for
packages that reserve much virtual memory, e.g. numpy's BLAS threads), not by RSS, and CPU contention between
runs is not limited; no PID namespace is used (seccomp forbids children, and the process group is killed);
concurrent runs share the sandbox uid, so RLIMIT_NPROC (which counts threads) is shared between them; without
seccomp and as uid 0 only the audit hook stops a fork bomb (the kernel never applies RLIMIT_NPROC to root);
without Landlock and as uid 0 a program can read and write whatever root can; kernel bugs and timing side
channels are out of scope.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from roll.pipelines.rewards import _isolation as iso
from roll.pipelines.rewards._sandbox_boot import EXIT_BLOCKED, EXIT_FILE_LIMIT, EXIT_MEMORY, MARKER
from roll.pipelines.rewards._sandbox_io import collect_output, memfd_with
from roll.runtime.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["SandboxLimits", "SandboxResult", "run_untrusted", "sandbox_layers"]

Status = Literal["ok", "error", "timeout", "memory", "blocked", "output_limit"]
SANDBOX_UID = 65534
_BOOT_SOURCE = (Path(__file__).with_name("_sandbox_boot.py")).read_text()
_SYSTEM_READ_ROOTS = (
    "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/etc/localtime",
    "/usr/share/zoneinfo", "/dev/urandom", "/dev/random", "/dev/zero", "/dev/null",
)  # fmt: skip


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (see :func:`run_untrusted`)."""

    timeout_s: float = 5.0
    cpu_s: float = 5
    memory_mb: int = 512
    max_output_bytes: int = 1 << 20
    max_file_mb: int = 16
    disk_mb: int = 64
    max_processes: int = 64
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"sandbox limit {field.name} must be a positive number, got {value!r}")

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> SandboxLimits:
        """Limits from a dict (e.g. reward_kwargs["sandbox"]); unknown keys raise ConfigError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values or {}) - names)
        if unknown:
            raise ConfigError(f"unknown sandbox limit(s) {unknown}; known: {sorted(names)}")
        return cls(**(values or {}))


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended. ``reason`` is a short human-readable cause ("" when ``status == "ok"``)."""

    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    reason: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class _Plan:
    """The kernel layers applied to every run (decided once by probing)."""

    ns_flags: int = 0
    tmpfs: bool = False
    uid: int | None = None
    drop_caps: bool = False
    landlock_abi: int = 0
    seccomp: bool = False


def _read_roots(site_packages: bool) -> list[str]:
    """Paths the program may read (and execute): the interpreter, its stdlib and libpython, system libraries."""
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    roots = {os.path.realpath(sys.executable), base["stdlib"], base["platstdlib"], *_SYSTEM_READ_ROOTS}
    libpython = sysconfig.get_config_var("LDLIBRARY")
    if libpython:
        roots.add(os.path.join(sysconfig.get_config_var("LIBDIR") or "", libpython))
    if sys.prefix != sys.base_prefix:
        roots.add(os.path.join(sys.prefix, "pyvenv.cfg"))
    if site_packages:
        roots.update({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return sorted({os.path.realpath(p) for p in roots if os.path.exists(p)})


def _make_preexec(plan: _Plan, limits: SandboxLimits, workdir: str, ruleset: iso.LandlockRuleset | None) -> Any:
    """The function the child runs between fork and exec. It only makes pre-resolved syscalls (no imports, locks)."""
    mb = 1 << 20
    cpu, memory, fsize = math.ceil(limits.cpu_s), int(limits.memory_mb * mb), int(limits.max_file_mb * mb)
    nofile, nproc = int(limits.max_open_files), int(limits.max_processes)
    rlimits = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (fsize, fsize)),
        (resource.RLIMIT_NOFILE, (nofile, nofile)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    outer_uid, outer_gid = os.getuid(), os.getgid()
    owner = plan.uid if plan.uid is not None else outer_uid
    target = os.fsencode(workdir)
    last_cap = iso.last_capability()

    def setup() -> None:
        if plan.ns_flags:
            iso.unshare(plan.ns_flags)
            if plan.ns_flags & iso.CLONE_NEWUSER:
                iso.map_own_ids(outer_uid, outer_gid)
            if plan.ns_flags & iso.CLONE_NEWNS:
                iso.make_mounts_private()
        if plan.tmpfs:
            iso.mount_tmpfs(target, int(limits.disk_mb * mb), owner, owner if plan.uid is not None else outer_gid)
            os.chdir(target)  # the cwd still points at the directory underneath the new mount
        if ruleset is not None:
            ruleset.allow_all(target)  # after the mount: the rule must name the tmpfs, not the hidden directory
        if plan.uid is not None:
            os.setgroups([])
            os.setresgid(plan.uid, plan.uid, plan.uid)
            os.setresuid(plan.uid, plan.uid, plan.uid)
        elif plan.drop_caps:
            iso.drop_capability_bounding_set(last_cap)
        iso.set_no_new_privs()
        iso.set_parent_death_signal(signal.SIGKILL)
        if ruleset is not None:
            ruleset.restrict_self()
        # Last: RLIMIT_NOFILE would make the steps above fail to open a descriptor in a parent that holds more
        # than max_open_files of them (a Ray worker does), and RLIMIT_AS would fail their allocations.
        for which, value in rlimits:
            resource.setrlimit(which, value)

    return setup


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # e.g. a real-time signal
        return f"signal {number}"


def _classify(rc: int, stdout: str, stderr: str, stop: str | None, cpu_used: float, limits: SandboxLimits):
    """(status, reason, stderr without the bootstrap's marker line) for a finished run."""
    marker = ""
    if MARKER in stderr:
        head, _, tail = stderr.rpartition(MARKER)
        marker, stderr = tail.strip(), head.rstrip("\n")
    if stop == "timeout":
        return "timeout", f"timeout after {limits.timeout_s:g} s", stderr
    if stop == "output":
        return "output_limit", f"output limit ({limits.max_output_bytes} bytes) exceeded", stderr
    if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu_used >= limits.cpu_s):
        return "timeout", f"cpu time limit ({limits.cpu_s} s) exceeded", stderr
    if rc == EXIT_MEMORY and marker:
        return "memory", f"memory limit ({limits.memory_mb} MB)", stderr
    if rc == EXIT_BLOCKED and marker:
        return "blocked", marker, stderr
    if rc == EXIT_FILE_LIMIT and marker:
        return "output_limit", marker, stderr
    if rc == -signal.SIGSYS:
        return "blocked", "blocked: forbidden system call", stderr
    if rc == 0:
        return "ok", "", stderr
    if rc < 0:
        return "error", f"killed by {_signal_name(-rc)}", stderr
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return "error", (lines[-1][:200] if lines else f"exit code {rc}"), stderr


def _remove_tree(path: str) -> None:
    """Delete the working directory, even if the program removed its own write permissions; never raises."""

    def retry_writable(func: Any, failed: str, _exc: Any) -> None:
        os.chmod(os.path.dirname(failed), 0o700)
        func(failed)

    try:
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=retry_writable)
        else:
            shutil.rmtree(path, onerror=retry_writable)
    except OSError as e:
        logger.warning("could not remove sandbox directory %s: %s", path, e)


def _execute(plan: _Plan, code: str, stdin: str, limits: SandboxLimits, flags: dict[str, Any]) -> SandboxResult:
    """One run under ``plan``. ``flags``: audit_hook, seccomp, site_packages, self_test."""
    workdir = tempfile.mkdtemp(prefix="roll-sandbox-")
    ruleset = None
    try:
        read_roots = _read_roots(flags["site_packages"])
        if plan.uid is not None:
            os.chown(workdir, plan.uid, plan.uid)
        if plan.landlock_abi:
            ruleset = iso.LandlockRuleset(plan.landlock_abi)
            ruleset.allow_read(read_roots)
            ruleset.allow("/dev/null", iso.FS_READ_FILE | iso.FS_WRITE_FILE)
        config = {
            "code_fd": -1,
            "workdir": os.path.realpath(workdir),
            "read_roots": read_roots,
            "seccomp": plan.seccomp and flags["seccomp"],
            "audit_hook": flags["audit_hook"],
            "block_native": not flags["site_packages"],  # installed packages load native code (numpy: ctypes)
            "self_test": flags.get("self_test", False),
        }
        with memfd_with(code.encode()) as code_fd, memfd_with(stdin.encode()) as stdin_fd:
            config["code_fd"] = code_fd
            argv = [sys.executable, "-I"] + ([] if flags["site_packages"] else ["-S"])
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
            try:
                proc = subprocess.Popen(
                    [*argv, "-c", _BOOT_SOURCE, json.dumps(config)],
                    stdin=stdin_fd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_make_preexec(plan, limits, workdir, ruleset),
                    pass_fds=(code_fd,),
                )
            except (subprocess.SubprocessError, OSError) as e:
                if not flags.get("self_test"):  # probes fail on purpose where a layer is missing
                    logger.warning("sandbox setup failed (%s); the program did not run", e)
                return SandboxResult("error", None, "", str(e), f"sandbox setup failed: {e}", 0.0)
        out = collect_output(proc, limits.timeout_s, limits.max_output_bytes)
        stdout = out.stdout.decode("utf-8", errors="replace")
        stderr = out.stderr.decode("utf-8", errors="replace")
        status, reason, stderr = _classify(out.returncode, stdout, stderr, out.stop, out.cpu_s, limits)
        return SandboxResult(status, out.returncode, stdout, stderr, reason, out.duration_s)
    finally:
        if ruleset is not None:
            ruleset.close()
        _remove_tree(workdir)


# --- probing ---------------------------------------------------------------------------------------------------
_probe_lock = threading.Lock()
_probed: tuple[_Plan, dict[str, str]] | None = None
_PROBE_LIMITS = SandboxLimits(timeout_s=20.0, cpu_s=10)


def _works(plan: _Plan) -> bool:
    flags = {"audit_hook": True, "seccomp": True, "site_packages": False, "self_test": True}
    result = _execute(plan, "", "", _PROBE_LIMITS, flags)
    if result.ok and "roll-sandbox-ok" in result.stdout:
        return True
    logger.debug("sandbox probe %s failed: %s %s", plan, result.reason, result.stderr[-500:])
    return False


def _probe() -> tuple[_Plan, dict[str, str]]:
    """Add kernel layers one at a time, keeping each that still lets the interpreter start."""
    layers: dict[str, str] = {"rlimits": "on", "process group kill": "on", "audit hook": "on (bypassable)"}
    plan = _Plan()
    is_root = os.geteuid() == 0
    base = iso.CLONE_NEWNET | iso.CLONE_NEWIPC | iso.CLONE_NEWUTS | iso.CLONE_NEWNS
    for flags, label in ((base, "root"), (base | iso.CLONE_NEWUSER, "user namespace"))[0 if is_root else 1 :]:
        if _works(dataclasses.replace(plan, ns_flags=flags)):
            plan = dataclasses.replace(plan, ns_flags=flags)
            layers["namespaces"] = f"net, ipc, uts, mount (via {label})"
            break
    else:
        layers["namespaces"] = "unavailable"
    candidate = dataclasses.replace(plan, tmpfs=True)
    tmpfs_ok = bool(plan.ns_flags) and _works(candidate)
    plan = candidate if tmpfs_ok else plan
    layers["disk quota"] = "private tmpfs" if tmpfs_ok else "unavailable (RLIMIT_FSIZE only)"
    if is_root:
        if _works(dataclasses.replace(plan, uid=SANDBOX_UID)):
            plan = dataclasses.replace(plan, uid=SANDBOX_UID)
            layers["privileges"] = f"uid/gid {SANDBOX_UID}"
        else:
            plan = dataclasses.replace(plan, drop_caps=True)
            layers["privileges"] = f"uid 0 without capabilities (uid {SANDBOX_UID} cannot run {sys.executable})"
    else:
        layers["privileges"] = f"unprivileged uid {os.geteuid()}"
    abi = iso.landlock_abi()
    if abi and _works(dataclasses.replace(plan, landlock_abi=abi)):
        plan = dataclasses.replace(plan, landlock_abi=abi)
        layers["landlock"] = f"ABI {abi}" + (", tcp denied" if abi >= 4 else "") + (", scoped" if abi >= 6 else "")
    else:
        layers["landlock"] = "unavailable"
    seccomp_ok = _works(dataclasses.replace(plan, seccomp=True))
    plan = dataclasses.replace(plan, seccomp=seccomp_ok)
    layers["seccomp"] = "on" if seccomp_ok else f"unavailable on {os.uname().machine}"
    return plan, layers


def _plan() -> _Plan:
    global _probed
    with _probe_lock:
        if _probed is None:
            _probed = _probe()
            summary = "; ".join(f"{k}: {v}" for k, v in _probed[1].items())
            weak = any(v.startswith("unavailable") for v in _probed[1].values())
            logger.log(logging.WARNING if weak else logging.INFO, "sandbox layers: %s", summary)
        return _probed[0]


def sandbox_layers() -> dict[str, str]:
    """Which containment layers :func:`run_untrusted` applies on this machine (probes on first use)."""
    _plan()
    return dict(_probed[1]) if _probed is not None else {}


def run_untrusted(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float = 5.0,
    cpu_s: float = 5,
    memory_mb: int = 512,
    max_output_bytes: int = 1 << 20,
    max_file_mb: int = 16,
    disk_mb: int = 64,
    max_processes: int = 64,
    max_open_files: int = 64,
    audit_hook: bool = True,
    seccomp: bool = True,
    site_packages: bool = False,
) -> SandboxResult:
    """Run ``code`` as a Python program with ``stdin`` as its input, contained as the module docstring describes.

    ``audit_hook``/``seccomp`` switch those layers off (tests use this to check the layers beneath them);
    ``site_packages`` lets the program import installed packages (read-only). Never raises for anything the
    program does: every outcome is a :class:`SandboxResult`.
    """
    limits = SandboxLimits(
        timeout_s, cpu_s, memory_mb, max_output_bytes, max_file_mb, disk_mb, max_processes, max_open_files
    )
    flags = {"audit_hook": audit_hook, "seccomp": seccomp, "site_packages": site_packages}
    return _execute(_plan(), code, stdin, limits, flags)
