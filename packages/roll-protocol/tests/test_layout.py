"""Import invariants: `roll` is a PEP 420 namespace, and roll.protocol stays free of heavy imports."""

from __future__ import annotations

import subprocess
import sys


def test_roll_is_a_namespace_spanning_packages():
    import roll  # pants: no-infer-dep

    assert getattr(roll, "__file__", None) is None
    assert len(list(roll.__path__)) >= 1
    assert roll.protocol.__version__ == "0.1.0"


def test_import_pulls_no_ray_pydantic_or_model_libraries():
    code = (
        "import sys, roll.protocol; "
        "bad = [m for m in ('ray', 'pydantic', 'transformers', 'vllm') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
