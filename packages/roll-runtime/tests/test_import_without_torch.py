"""Importing roll.runtime never imports torch or tensordict (a fresh interpreter checks sys.modules)."""

from __future__ import annotations

import subprocess
import sys

from roll.runtime.testing import child_env


def test_importing_the_runtime_imports_no_torch():
    code = (
        "import sys, roll.runtime\nheavy = sorted({'torch', 'tensordict'} & set(sys.modules))\nassert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 0, result.stderr
