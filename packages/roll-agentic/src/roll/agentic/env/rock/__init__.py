"""ROLL's ``rock_tb_native_env``: SWE / terminal-bench tasks in ROCK sandboxes (see :mod:`.env`)."""

from __future__ import annotations

from roll.agentic.env.rock.config import RockEnvConfig
from roll.agentic.env.rock.env import RockTBNativeEnv, check_env_config

__all__ = ["RockEnvConfig", "RockTBNativeEnv", "check_env_config"]
