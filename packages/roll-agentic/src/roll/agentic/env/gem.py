"""Environments of the ``gem-llm`` package (games, math, code, QA, reasoning-gym) by their GEM ids.

Needs the extra: ``pip install 'roll-agentic[gem]'``. GEM's envs already speak the contract of
:mod:`roll.agentic.env.base`; this adapter adds what roll's env managers read: ``info["success"]`` (GEM reports
none, so a terminated, untruncated episode whose last reward reaches ``success_reward`` counts as solved) and
``uses_global_rng`` (GEM seeds and draws from the process-global ``random``/``numpy`` generators).
"""

from __future__ import annotations

from typing import Any

from roll.agentic.env.base import Env, ResetOutput, StepOutput, check_reset_output, check_step_output
from roll.runtime import ConfigError, MissingExtraError

__all__ = ["GemEnv", "gem_env_ids", "import_gem"]


def import_gem() -> Any:
    """The ``gem`` module, or MissingExtraError with the pip command that installs it."""
    try:
        import gem
    except ModuleNotFoundError as e:
        raise MissingExtraError("GEM environments", "roll-agentic", "gem", cause=str(e)) from e
    return gem


def gem_env_ids() -> list[str]:
    """Every env id registered with GEM."""
    import_gem()
    from gem.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


class GemEnv(Env):
    """One GEM environment, made with ``gem.make(env_id, **kwargs)``."""

    uses_global_rng = True

    def __init__(self, env_id: str, success_reward: float = 1.0, **kwargs: Any) -> None:
        gem = import_gem()
        if env_id not in gem_env_ids():
            raise ConfigError(f"unknown GEM env id {env_id!r}; GEM knows e.g. {gem_env_ids()[:8]} ...")
        self.env_id = env_id
        self.success_reward = success_reward
        self.env = gem.make(env_id, **kwargs)

    def reset(self, seed: int | None = None) -> ResetOutput:
        observation, info = check_reset_output(self.env.reset(seed=seed))
        info.setdefault("success", False)
        return observation, info

    def step(self, action: str) -> StepOutput:
        observation, reward, terminated, truncated, info = check_step_output(self.env.step(action))
        info.setdefault("success", terminated and not truncated and reward >= self.success_reward)
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def sample_random_action(self) -> str:
        return self.env.sample_random_action()
