"""Importing roll.runtime never imports torch or tensordict (a fresh interpreter checks sys.modules)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_importing_the_runtime_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = (
        "import sys, roll.runtime\nheavy = sorted({'torch', 'tensordict'} & set(sys.modules))\nassert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
