"""Helpers for testing code built on roll.runtime (roll's own tests use them too)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import ray

from roll.runtime._bootstrap import RayInfo, init, shutdown


@contextlib.contextmanager
def local_ray(num_cpus: int = 32, **kwargs: Any) -> Iterator[RayInfo]:
    """A private local Ray for a test session: auth off, many logical CPUs so many small actors fit."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    already = ray.is_initialized()
    info = init(num_cpus=num_cpus, **kwargs)
    try:
        yield info
    finally:
        if not already:
            shutdown()


def ship_module_by_value(module_name: str) -> None:
    """Let Ray workers use classes defined in a module they cannot import (a test file, a notebook cell).

    Ray pickles such classes by reference by default, which fails in a worker process that lacks the module.
    """
    module: ModuleType = sys.modules[module_name]
    ray.cloudpickle.register_pickle_by_value(module)
