"""Repository-wide pytest hooks: tests marked `gpu` run only where CUDA is available."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)
