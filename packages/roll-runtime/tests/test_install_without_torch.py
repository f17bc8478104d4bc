"""roll-runtime from built wheels, in a fresh virtual environment: no torch installed, none imported, the example runs.

Builds the roll-protocol and roll-runtime wheels from this checkout, installs them with their dependencies (pip
fetches ray, pydantic, numpy and pyarrow from the configured index, pinned to this environment's versions so a
warm pip cache serves them) into a new venv, and runs ``import roll.runtime`` and the text_filter example there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ["roll-protocol", "roll-runtime"]
EXAMPLE = ROOT / "packages" / "roll-runtime" / "examples" / "text_filter.py"


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> str:
    result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.slow
@pytest.mark.extra("pip")  # Pants' test environment has no pip; ./tools/dev test runs this one in the dev venv
def test_runtime_wheels_install_and_run_without_torch(tmp_path):
    pytest.importorskip("pip", reason="builds wheels with pip")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS")}
    env["RAY_AUTH_MODE"] = "disabled"
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels)]
        + [str(ROOT / "packages" / p) for p in PACKAGES],
        env,
        tmp_path,
        300,
    )
    built = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert built == ["roll_protocol", "roll_runtime"]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], env, tmp_path, 120)
    python = str(venv / "bin" / "python")
    pins = [f"{name}=={version(name)}" for name in ("ray", "pydantic", "numpy", "pyarrow")]
    _run(
        [python, "-m", "pip", "install", "-q", *map(str, wheels.glob("*.whl")), *pins],
        env,
        tmp_path,
        600,
    )
    installed = json.loads(_run([python, "-m", "pip", "list", "--format=json"], env, tmp_path, 120))
    names = {item["name"].lower() for item in installed}
    assert {"roll-protocol", "roll-runtime", "ray"} <= names
    assert not {"torch", "tensordict", "transformers"} & names, sorted(names)

    probe = (
        "import sys, roll.runtime, roll.protocol\n"
        "assert roll.runtime.__file__.startswith(sys.prefix), roll.runtime.__file__\n"
        "heavy = sorted({'torch', 'tensordict', 'transformers'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
        "print(roll.protocol.has_tensor_extra())\n"
    )
    assert _run([python, "-c", probe], env, tmp_path, 120).strip() == "False"

    output = tmp_path / "kept.jsonl"
    args = ["--docs", "100", "--workers", "2", "--batch-size", "40", "--output", str(output)]
    printed = _run([python, str(EXAMPLE), *args], env, tmp_path, 300)
    assert "kept 70/100 documents" in printed, printed
    assert len(output.read_text().splitlines()) == 70
