"""roll's benchmarks, run as modules from the repository root (``./tools/dev bench NAME`` does that)::

    python -m tools.bench.protocol      # DataProto operations and serialization vs verl's DataProto
    python -m tools.bench.dispatch      # Cluster dispatch overhead vs raw Ray and verl
    python -m tools.bench.strategies    # generation (vLLM vs hf_infer) and weight-sync bandwidth
    python -m tools.bench.weight_sync_gpu  # weight sync on one GPU (CUDA IPC) vs a device copy; needs CUDA
    python -m tools.bench.rlvr_vs_trl   # GRPO on the rlvr-tiny recipe: roll vs TRL

Each prints a readable report, then ``RESULT {json}`` as its last stdout line (``--result-file PATH`` also writes
the JSON to a file). Measuring lives in :mod:`tools.bench._measure`, reporting in :mod:`tools.bench._report`, and
running side benchmarks in other interpreters (verl's, TRL's venvs) in :mod:`tools.bench._sides`. This package
imports nothing heavy, so a side venv without roll can import it.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "tools" / ".cache"  # git-ignored
