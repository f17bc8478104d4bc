"""ROLL's ``atropos_env``: Atropos (``atroposlib``) environment classes as roll envs (``roll-agentic[atropos]``)."""

from __future__ import annotations

from roll.agentic.env.atropos.env import (
    AtroposEnv,
    AtroposRewardConfig,
    FormatMarker,
    episode_reward,
    first_score,
    import_atropos,
)

__all__ = ["AtroposEnv", "AtroposRewardConfig", "FormatMarker", "episode_reward", "first_score", "import_atropos"]
