from __future__ import annotations

import pytest

from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)
from roll.runtime import ResourceManager
from roll.runtime.testing import local_ray


@pytest.fixture(scope="session")
def ray_session():
    with local_ray(num_cpus=64) as info:
        yield info


@pytest.fixture(scope="session")
def resources(ray_session) -> ResourceManager:
    return ResourceManager()
