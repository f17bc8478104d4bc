"""A private local Ray and asset cache for the pipeline runs of this folder (started only when asked for)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory):
    from roll.runtime.testing import local_ray

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLL_CACHE_DIR", str(tmp_path_factory.mktemp("roll-cache")))
        with local_ray(num_cpus=8):
            yield
