"""The package imports without optional extras and exports its public API."""

from __future__ import annotations

import subprocess
import sys

import roll.agentic


def test_public_names_resolve() -> None:
    missing = [name for name in roll.agentic.__all__ if not hasattr(roll.agentic, name)]
    assert not missing
    assert {"RolloutScheduler", "PolicyClient", "EnvironmentWorker", "make_env"} <= set(roll.agentic.__all__)


def test_import_does_not_load_optional_extras() -> None:
    code = "import sys, roll.agentic; print(sorted(m for m in ('gem', 'mcp') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "[]"
