"""pytest hooks shared by the test suites of all roll packages.

Each package's ``tests/conftest.py`` (and integration-tests/) imports these two hooks, so its tests run the same way
from the repository, from an unpacked sdist and under Pants: nothing depends on a conftest.py at the repository root.
Import this module only from a conftest.py; it needs pytest, which no roll package depends on.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["MARKERS", "pytest_collection_modifyitems", "pytest_configure"]

MARKERS = {
    "gpu": "needs a CUDA device; skipped without one",
    "slow": "takes more than ~30 s on a loaded 2-core machine (many actors, a CLI run in a subprocess); "
    "`./tools/dev test` runs these once, with plain pytest, and leaves them out of its Pants pass",
    "integration": "cross-package end-to-end run",
    "pipeline_run": "starts a whole pipeline (Ray actors that import torch and train or roll out; the slowest tests); "
    "`./tools/dev test` runs these once, with plain pytest, and leaves them out of its Pants pass",
    "learning": "runs a recipe for minutes and asserts a learning result; `./tools/dev test` leaves these out (run them "
    "with `pytest -m learning`)",
    "extra(name)": "needs an optional package left out of the Pants resolve (vLLM, trackers); skips without it, and "
    "`./tools/dev test` runs these tests with plain pytest in the dev venv",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


def _has_cuda() -> bool:
    try:
        import torch  # pants: no-infer-dep (only asked when a gpu test was collected; torch may be absent)
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _has_cuda():
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
