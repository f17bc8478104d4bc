"""Small helpers shared by the benchmarks under tools/bench/: timing, tables, memory, side venvs, RESULT lines.

Nothing here knows about any particular benchmark. Conventions the helpers assume:

* a benchmark prints a readable table, then as its LAST stdout line ``RESULT {json}`` (see :func:`emit_result`);
* timings are wall-clock seconds from :func:`time.perf_counter`, with ``gc.collect()`` before every repetition
  so that one measurement does not pay for the garbage of the previous one.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "tools" / ".cache"  # git-ignored


# --- timing ---------------------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(times: Sequence[float]) -> dict[str, Any]:
    """median / p90 / min / max / mean of a list of seconds, plus the raw list (rounded to the microsecond)."""
    return {
        "median_s": statistics.median(times),
        "p90_s": percentile(times, 90),
        "min_s": min(times),
        "max_s": max(times),
        "mean_s": statistics.fmean(times),
        "reps": len(times),
        "times_s": [round(t, 6) for t in times],
    }


def measure(
    fn: Callable[[], Any],
    *,
    reps: int = 5,
    warmup: int = 1,
    setup: Callable[[], Any] | None = None,
    teardown: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Time ``fn`` ``reps`` times after ``warmup`` untimed calls.

    ``setup`` (untimed) runs before each call and its return value is passed to ``fn``; ``teardown`` (untimed)
    gets ``fn``'s result, so large outputs can be freed before the next repetition. ``gc.collect()`` runs before
    every call so the garbage of one repetition is not charged to the next, and the collector is off while
    ``fn`` runs (as :mod:`timeit` does). Call :func:`freeze_heap` once after the imports and the test data are
    built, or each ``gc.collect()`` walks every long-lived object (hundreds of ms with torch and ray loaded).
    """
    times: list[float] = []
    faults: list[int] = []
    for i in range(warmup + reps):
        arg = setup() if setup is not None else None
        gc.collect()
        with gc_disabled():
            f0 = minor_faults()
            t0 = time.perf_counter()
            out = fn(arg) if setup is not None else fn()
            elapsed = time.perf_counter() - t0
            f1 = minor_faults()
        if teardown is not None:
            teardown(out)
        del out, arg
        gc.collect()
        if i >= warmup:
            times.append(elapsed)
            faults.append(f1 - f0)
    res = summarize(times)
    res["minor_faults"] = int(statistics.median(faults))
    return res


def minor_faults() -> int:
    """Minor page faults of this process so far: a fresh buffer costs one per 4 KiB page it touches (one per
    2 MiB with transparent huge pages), which is often the real cost of an "allocating" copy."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class gc_disabled:
    """Context manager: the cyclic garbage collector is off inside (restored to its previous state after)."""

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()


def freeze_heap() -> None:
    """Collect, then move every surviving object to the permanent generation (``gc.freeze``) so that later
    ``gc.collect()`` calls only walk objects created after this point: cheap collections between repetitions.
    The heap is unfrozen at exit, so that interpreter shutdown still collects those objects (extension modules
    such as nanobind-based ones otherwise print leak reports)."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


# --- memory ---------------------------------------------------------------------------------------------------
def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB.

    Reads VmHWM from /proc/self/status where available: Linux's ru_maxrss survives exec, so a subprocess started
    by a big parent would otherwise report the parent's peak. Falls back to ru_maxrss (KiB on Linux, bytes on
    macOS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def current_rss_mib() -> float | None:
    """Current resident set size in MiB, or None where /proc is not available."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return None


# --- formatting -----------------------------------------------------------------------------------------------
def fmt_seconds(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_rate(bytes_per_s: float | None) -> str:
    if not bytes_per_s:
        return "-"
    return f"{bytes_per_s / 1e9:.2f} GB/s"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], left: Sequence[int] = (0,)) -> str:
    """A plain-text table; the columns whose indices are in ``left`` are left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        text = "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return text.rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def environment() -> dict[str, Any]:
    """A few facts about the machine a number was measured on."""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load] if load else None,
    }


def emit_result(result: dict[str, Any]) -> None:
    """Print the machine-readable summary: must be the benchmark's last stdout line."""
    sys.stdout.flush()
    print("RESULT " + json.dumps(result, separators=(",", ":"), default=_json_default), flush=True)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return repr(value)


# --- side virtual environments --------------------------------------------------------------------------------
def find_python(version: tuple[int, int] = (3, 11)) -> str | None:
    """An interpreter of the given major.minor version: the current one if it matches, else pythonX.Y on PATH."""
    if sys.version_info[:2] == version:
        base = getattr(sys, "_base_executable", None) or sys.executable
        if base and os.path.exists(base):
            return base
    return shutil.which(f"python{version[0]}.{version[1]}")


def ensure_venv(
    path: Path,
    install_steps: Sequence[Sequence[str]],
    *,
    python: str | None = None,
    check: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
    timeout_s: float = 3600,
) -> Path:
    """Create (idempotently) a venv at ``path`` and run ``install_steps`` in it; return its python.

    Each step is the argument list of one ``python -m pip install`` call, run in order (so a pinned package can
    be installed before the ones that would otherwise pull another build of it). A stamp file records a hash of
    the steps; while it matches (and ``check``, a ``python -c`` snippet, still succeeds) nothing is reinstalled.
    Raises ``RuntimeError`` with the tail of pip's output when a step fails.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    py = path / "bin" / "python"
    stamp = path / ".bench-venv-stamp"
    want = hashlib.sha256(json.dumps([list(s) for s in install_steps]).encode()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        if not check or _run([str(py), "-c", *check], timeout_s=300)[0] == 0:
            return py
        log(f"[bench] venv {path} fails its check; reinstalling")
    interpreter = python or find_python()
    if interpreter is None:
        raise RuntimeError("no python3.11 interpreter found to create the venv")
    if not py.exists():
        log(f"[bench] creating venv {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        rc, out = _run([interpreter, "-m", "venv", str(path)], timeout_s=600)
        if rc != 0:
            raise RuntimeError(f"python -m venv failed (rc={rc}): {out[-2000:]}")
    stamp.unlink(missing_ok=True)
    for step in install_steps:
        log(f"[bench] pip install {' '.join(step)}")
        t0 = time.perf_counter()
        rc, out = _run([str(py), "-m", "pip", "install", "-q", *step], timeout_s=timeout_s)
        if rc != 0:
            raise RuntimeError(f"pip install {' '.join(step)} failed (rc={rc}): {out[-3000:]}")
        log(f"[bench]   done in {time.perf_counter() - t0:.0f} s")
    if check:
        rc, out = _run([str(py), "-c", *check], timeout_s=300)
        if rc != 0:
            raise RuntimeError(f"venv check failed (rc={rc}): {out[-3000:]}")
    stamp.write_text(want + "\n")
    return py


def _run(cmd: Sequence[str], timeout_s: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {timeout_s} s: {e}"
    except OSError as e:
        return 127, str(e)
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def run_json_subprocess(
    cmd: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None, marker: str = "RESULT "
) -> dict[str, Any]:
    """Run a side benchmark that prints ``<marker>{json}`` on its last stdout line; return that JSON.

    Its stderr is passed through (so progress is visible); raises ``RuntimeError`` if it fails or prints no
    result line.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        proc = subprocess.run(
            list(cmd), stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout_s, env=full_env
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{cmd[0]} timed out after {timeout_s} s") from e
    lines = [ln for ln in (proc.stdout or "").splitlines() if ln.startswith(marker)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout or "")[-2000:]
        raise RuntimeError(f"side benchmark exited with rc={proc.returncode}; stdout tail: {tail}")
    return json.loads(lines[-1][len(marker) :])
