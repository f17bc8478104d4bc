"""Fixtures for the diffusion pipeline runs: the tiny teacher (the ``diffusion-pretrain-tiny`` recipe, trained once
into the shared asset cache and reused by every later run: minutes of CPU the first time) and a private local Ray."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers")

from roll.pipelines.launcher import run_cached_recipe
from roll.runtime.testing import local_ray


@pytest.fixture(scope="session")
def teacher_path() -> str:
    """The recipes' teacher folder, resolved before any test changes the cache directory."""
    with local_ray(num_cpus=8):
        return str(run_cached_recipe("diffusion-pretrain-tiny"))


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory, teacher_path: str):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLL_CACHE_DIR", str(tmp_path_factory.mktemp("roll-cache")))
        with local_ray(num_cpus=8):
            yield teacher_path
