"""Fixtures for the reward tests: a private local Ray for the worker tests (started only when one asks for it)."""

from __future__ import annotations

import pytest

from roll.runtime import ResourceManager
from roll.runtime.testing import local_ray


@pytest.fixture(scope="session")
def ray_session():
    with local_ray(num_cpus=8) as info:
        yield info


@pytest.fixture(scope="session")
def resources(ray_session) -> ResourceManager:
    return ResourceManager()
