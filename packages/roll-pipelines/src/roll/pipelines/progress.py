"""The step progress of a run: a redrawn bar on a terminal, plain periodic lines anywhere else.

A redrawn bar written to a file or a pipe leaves one carriage-return line per step in it. When the stream is not a
terminal, :func:`step_progress` writes a line such as ``rlvr-tiny: step 40/200 (20%), 1m12s elapsed, ETA 4m48s``
on the first and last step, every ``max(1, total // 20)`` steps, and whenever ``min_interval_s`` has passed since
the last line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["PlainProgress", "format_duration", "step_progress"]


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; ``3725`` -> ``1h02m05s``; ``9.6`` -> ``10s``."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class PlainProgress:
    """Progress as whole lines on a non-terminal stream (see the module docstring)."""

    def __init__(
        self,
        total: int,
        initial: int,
        desc: str,
        stream: TextIO,
        *,
        min_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.done, self.desc, self.stream = total, initial, desc, stream
        self.start_step = initial
        self.every = max(1, total // 20)
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.started = self.last_line = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        first = self.done - n == self.start_step
        due = self.done % self.every == 0 or now - self.last_line >= self.min_interval_s
        if first or due or self.done >= self.total:
            self.last_line = now
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = now - self.started
        ran = self.done - self.start_step
        text = f"{self.desc}: step {self.done}/{self.total} ({100 * self.done // max(1, self.total)}%)"
        text += f", {format_duration(elapsed)} elapsed"
        if ran > 0 and self.done < self.total:
            text += f", ETA {format_duration(elapsed / ran * (self.total - self.done))}"
        return text


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def step_progress(total: int, initial: int, desc: str, stream: TextIO | None = None) -> Iterator[Any]:
    """An object with ``update(n=1)``: a tqdm bar when ``stream`` (default stderr) is a terminal, else
    :class:`PlainProgress`."""
    stream = stream if stream is not None else sys.stderr
    if not _is_terminal(stream):
        yield PlainProgress(total, initial, desc, stream)
        return
    from tqdm import tqdm

    with tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, leave=True, file=stream) as bar:
        yield bar
