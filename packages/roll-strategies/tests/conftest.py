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


@pytest.fixture(scope="module")
def isolated_process():
    """For a module that runs strategies in this process (``pytestmark = pytest.mark.usefixtures(...)``): one torch
    thread (tiny matmuls on a busy 2-core machine are many times faster without OpenMP threads waiting for cores);
    a default process group the in-process strategies create is removed afterwards."""
    import torch
    import torch.distributed as dist

    threads, had_group = torch.get_num_threads(), dist.is_initialized()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    if not had_group and dist.is_initialized():
        dist.destroy_process_group()
