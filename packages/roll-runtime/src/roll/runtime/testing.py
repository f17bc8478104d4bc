"""Helpers for testing code built on roll.runtime (roll's own tests use them too)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
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


def child_env(**overrides: str) -> dict[str, str]:
    """This process's environment for a Python child, with ``PYTHONPATH`` set to this process's import path.

    Under Pants roll's sources are not installed, only on ``sys.path`` (as paths relative to the sandbox), so the
    entries are made absolute: the child may run in another folder.
    """
    path = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
    return {**os.environ, "PYTHONPATH": path, **overrides}


def spawn_process(target: Callable[..., Any], *args: Any) -> BaseProcess:
    """Start ``target(*args)`` in a fresh interpreter (multiprocessing's ``spawn``), ``target`` shipped by value.

    ``spawn`` pickles a function by its module's name, and a test file imported by pytest's ``importlib`` mode (or
    run under Pants) is a module the child cannot import. The arguments still go through multiprocessing, so
    queues and pipes of the spawn context work.
    """
    ship_module_by_value(target.__module__)
    process = multiprocessing.get_context("spawn").Process(
        target=_call_shipped, args=(ray.cloudpickle.dumps(target), *args)
    )
    process.start()
    return process


def _call_shipped(payload: bytes, *args: Any) -> None:
    ray.cloudpickle.loads(payload)(*args)
