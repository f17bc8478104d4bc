"""Short learning checks of the learning matrix (``./tools/dev bench learning``): GRPO and PPO raise held-out
correctness on the quick-start task.

Each runs one algorithm of ``tools.bench.learning`` for fewer steps than the matrix, from the cached SFT warm-up
(trained once per test session, shared with the other integration tests' runs), and asserts a looser bound than
the quick start's: ``val/correct`` (the answer right, whatever its format) on the 256 held-out problems rises by 10
points (the quick start's target is 15 in 30 steps; the matrix measured about +40 in 20), while the format, which
the warm-up already has, stays. The bound can fail: a run that learns only the format, or nothing, does not pass.
``./tools/dev test`` runs this file (CI's short learning checks).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.learning import run_variant

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.learning]

STEPS = 10
MIN_GAIN = 0.10


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_short_run_raises_held_out_correctness(algo: str, tmp_path: Path, roll_env: dict[str, str]) -> None:
    row = run_variant(
        algo,
        steps=STEPS,
        work_dir=tmp_path,
        cache_dir=Path(roll_env["ROLL_CACHE_DIR"]),
        timeout_s=3600,
        min_gain=MIN_GAIN,
    )
    assert row.error is None, row.error
    assert row.steps == STEPS
    assert row.format_before is not None and row.format_before >= 0.9, row
    assert row.gain is not None and row.gain >= MIN_GAIN, row
    assert row.format_after is not None and row.format_after >= 0.8, row
