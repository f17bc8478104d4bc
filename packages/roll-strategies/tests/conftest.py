from __future__ import annotations

from pathlib import Path

import pytest

from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)
from roll.strategies.testing import make_tiny_causal_lm


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A ~0.36M-parameter Qwen2 (head dim 64) with its BPE tokenizer, in HF format."""
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "nano", preset="nano", seed=0)


@pytest.fixture(scope="session")
def ray_session():
    from roll.runtime.testing import local_ray

    with local_ray(num_cpus=64) as info:
        yield info


@pytest.fixture(scope="session")
def resources(ray_session):
    from roll.runtime import ResourceManager

    return ResourceManager()
