"""A worker's console output: third-party noise to a log file, roll's own warnings to the driver.

Inference and training libraries print a great deal from inside workers (deprecation warnings, NUMA and allocator
hints, thread-pool notices, repeated on every call), which Ray forwards to the driver's console between the progress
bar and the metric lines. When the environment variable ``ROLL_WORKER_LOG`` names a file, a worker sends its
stdout and stderr there instead, at the file-descriptor level, so what native code prints goes there too. Warnings
of roll's own loggers (``roll.*``) still reach the driver's console, prefixed with the worker's name.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

__all__ = ["ENV_WORKER_LOG", "redirect_worker_output"]

ENV_WORKER_LOG = "ROLL_WORKER_LOG"

_state: dict[str, str] = {}  # the file this process already writes to (one redirect per process)


def redirect_worker_output(path: str | os.PathLike[str], label: str) -> None:
    """Send this process's stdout and stderr to ``path`` (appended), keeping ``roll.*`` warnings on the console.

    Idempotent within a process. ``label`` (e.g. ``actor_infer-0``) prefixes the warnings kept on the console and
    the header line written to the file.
    """
    target = str(Path(path).expanduser())
    if _state.get("path") == target:
        return
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    handler = logging.StreamHandler(console)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"({label}) %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("roll").addHandler(handler)
    _state["path"] = target
    print(f"----- {label} (pid {os.getpid()}): stdout and stderr follow -----", flush=True)
