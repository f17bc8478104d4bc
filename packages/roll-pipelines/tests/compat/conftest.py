"""Fixtures for the ROLL-format runs: a private local Ray and asset cache per test module (started only when asked for)."""

from __future__ import annotations

import pytest

from roll.runtime.testing import local_ray


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory):
    """A private local Ray and asset cache shared by this module's runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLL_CACHE_DIR", str(tmp_path_factory.mktemp("roll-cache")))
        with local_ray(num_cpus=8):
            yield
