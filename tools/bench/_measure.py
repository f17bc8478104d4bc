"""Measuring for the benchmarks: repeated timings with their statistics, page faults, memory, the machine.

Timings are wall-clock seconds from :func:`time.perf_counter`, with ``gc.collect()`` before every repetition so
that one measurement does not pay for the garbage of the previous one.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

K = TypeVar("K")

__all__ = [
    "current_rss_mib",
    "environment",
    "freeze_heap",
    "gc_disabled",
    "interleaved",
    "measure",
    "minor_faults",
    "peak_rss_mib",
    "percentile",
    "summarize",
]


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


def interleaved(run: Callable[[K], float], variants: Sequence[K], reps: int) -> dict[K, list[float]]:
    """Seconds of ``run(variant)`` for each variant: one untimed call of each first, then ``reps`` rounds of one call
    of each, so that load from other processes falls on all variants alike (``run`` times itself and returns the
    seconds)."""
    for variant in variants:
        run(variant)  # warm-up
    times: dict[K, list[float]] = {variant: [] for variant in variants}
    for _ in range(reps):
        for variant in variants:
            times[variant].append(run(variant))
    return times


def measure(
    fn: Callable[..., Any],
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


# --- the machine ----------------------------------------------------------------------------------------------
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
