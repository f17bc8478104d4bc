"""Side benchmarks: other interpreters (verl's or TRL's venv, a fresh process of this one) that run a module of
this package and print ``RESULT {json}``. Every side runs as ``python -m tools.bench.<module>`` from the
repository root, so it imports this package without any ``sys.path`` edits.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.bench import CACHE_DIR, REPO_ROOT

__all__ = [
    "ensure_venv",
    "ensure_verl_venv",
    "find_python",
    "module_command",
    "run_json_subprocess",
    "run_verl_side",
]

# verl's venv, shared by the protocol and dispatch benchmarks (one spec, so neither rebuilds the other's).
VERL_VENV = CACHE_DIR / "venv-verl"
TORCH_PIN = "torch==2.13.0"  # the CPU build ./tools/dev pins (TORCH_SPEC)
# torch first and on its own: anything installed before it that needs torch pulls a multi-GB CUDA build.
VERL_INSTALL_STEPS = [
    [TORCH_PIN],
    ["--no-deps", "verl==0.9.1"],
    [TORCH_PIN, "tensordict", "ray", "omegaconf", "transformers"],
]
VERL_CHECK = ["from verl.protocol import DataProto"]


def module_command(python: str | Path, module: str, *args: str) -> list[str]:
    """``python -m tools.bench.<module> args...``; run it with ``cwd=REPO_ROOT``."""
    return [str(python), "-m", f"tools.bench.{module}", *args]


def find_python(version: tuple[int, int] = (3, 11)) -> str | None:
    """An interpreter of the given major.minor version: the current one if it matches, else pythonX.Y on PATH."""
    if sys.version_info[:2] == version:
        base = getattr(sys, "_base_executable", None) or sys.executable
        if base and os.path.exists(base):
            return base
    return shutil.which(f"python{version[0]}.{version[1]}")


def ensure_venv(
    path: Path,
    install_steps: Sequence[Sequence[str]],
    *,
    python: str | None = None,
    check: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
    timeout_s: float = 3600,
) -> Path:
    """Create (idempotently) a venv at ``path`` and run ``install_steps`` in it; return its python.

    Each step is the argument list of one ``python -m pip install`` call, run in order (so a pinned package can
    be installed before the ones that would otherwise pull another build of it). A stamp file records a hash of
    the steps; while it matches (and ``check``, a ``python -c`` snippet, still succeeds) nothing is reinstalled.
    Raises ``RuntimeError`` with the tail of pip's output when a step fails.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    py = path / "bin" / "python"
    stamp = path / ".bench-venv-stamp"
    want = hashlib.sha256(json.dumps([list(s) for s in install_steps]).encode()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        if not check or _run([str(py), "-c", *check], timeout_s=300)[0] == 0:
            return py
        log(f"[bench] venv {path} fails its check; reinstalling")
    interpreter = python or find_python()
    if interpreter is None:
        raise RuntimeError("no python3.11 interpreter found to create the venv")
    if not py.exists():
        log(f"[bench] creating venv {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        rc, out = _run([interpreter, "-m", "venv", str(path)], timeout_s=600)
        if rc != 0:
            raise RuntimeError(f"python -m venv failed (rc={rc}): {out[-2000:]}")
    stamp.unlink(missing_ok=True)
    for step in install_steps:
        log(f"[bench] pip install {' '.join(step)}")
        t0 = time.perf_counter()
        rc, out = _run([str(py), "-m", "pip", "install", "-q", *step], timeout_s=timeout_s)
        if rc != 0:
            raise RuntimeError(f"pip install {' '.join(step)} failed (rc={rc}): {out[-3000:]}")
        log(f"[bench]   done in {time.perf_counter() - t0:.0f} s")
    if check:
        rc, out = _run([str(py), "-c", *check], timeout_s=300)
        if rc != 0:
            raise RuntimeError(f"venv check failed (rc={rc}): {out[-3000:]}")
    stamp.write_text(want + "\n")
    return py


def ensure_verl_venv(log: Callable[[str], None] | None = None) -> Path:
    """verl's venv (:data:`VERL_VENV`, built by :func:`ensure_venv` on first use); its python. Raises ``RuntimeError``
    naming the folder when it cannot be built."""
    try:
        return ensure_venv(VERL_VENV, VERL_INSTALL_STEPS, check=VERL_CHECK, log=log)
    except Exception as e:
        raise RuntimeError(f"could not create the verl venv at {VERL_VENV}: {e}") from e


def _run(cmd: Sequence[str], timeout_s: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {timeout_s} s: {e}"
    except OSError as e:
        return 127, str(e)
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def run_json_subprocess(
    cmd: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None, marker: str = "RESULT "
) -> dict[str, Any]:
    """Run a side benchmark (from the repository root) that prints ``<marker>{json}`` on its last stdout line;
    return that JSON.

    Its stderr is passed through (so progress is visible); raises ``RuntimeError`` if it fails or prints no
    result line.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        proc = subprocess.run(
            list(cmd), stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout_s, env=full_env, cwd=REPO_ROOT
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{cmd[0]} timed out after {timeout_s} s") from e
    lines = [ln for ln in (proc.stdout or "").splitlines() if ln.startswith(marker)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout or "")[-2000:]
        raise RuntimeError(f"side benchmark exited with rc={proc.returncode}; stdout tail: {tail}")
    return json.loads(lines[-1][len(marker) :])


def run_verl_side(
    module: str, args: Sequence[str], *, timeout_s: float, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """``python -m tools.bench.<module> args...`` in verl's venv (built on first use); its ``RESULT`` JSON, or
    ``{"error": ...}`` saying why there is none (the venv could not be built, the side failed), so the roll side's
    numbers are still reported."""
    try:
        py = ensure_verl_venv(log)
    except RuntimeError as e:
        return {"error": str(e)}
    try:
        return run_json_subprocess(
            module_command(py, module, *args), timeout_s=timeout_s, env={"RAY_AUTH_MODE": "disabled"}
        )
    except Exception as e:
        return {"error": f"verl side failed: {e}"}
