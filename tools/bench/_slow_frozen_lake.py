"""agentic_rollout's env: FrozenLake whose step also takes a lognormal time. In a module of its own, imported when the
benchmark runs, so that importing the benchmark (``--help``) does not load roll.agentic and torch."""

from __future__ import annotations

import math
import os
import random
import time

from roll.agentic.env import FrozenLakeEnv

ENV_STEP_MEDIAN_S = float(os.environ.get("ROLL_BENCH_ENV_STEP_S", "0.005"))  # agentic_rollout sets --env-step-ms
ENV_STEP_SIGMA = 0.5


class SlowFrozenLake(FrozenLakeEnv):
    """FrozenLake whose step also takes a lognormal time (seeded by the episode, so both modes wait the same)."""

    def reset(self, seed: int | None = None):
        self._delay_rng = random.Random(seed)
        return super().reset(seed)

    def step(self, action: str):
        time.sleep(ENV_STEP_MEDIAN_S * math.exp(ENV_STEP_SIGMA * self._delay_rng.gauss(0.0, 1.0)))
        return super().step(action)
