"""Environments: GEM's text API, a registry of env types, and built-in games (FrozenLake, Sokoban, arithmetic)."""

from __future__ import annotations

from roll.agentic.env.base import (
    Env,
    EnvLike,
    EnvOutputError,
    check_reset_output,
    check_step_output,
    info_flag,
)
from roll.agentic.env.frozen_lake import FrozenLakeEnv
from roll.agentic.env.math_tool import ArithmeticEnv, make_tool_math_env
from roll.agentic.env.parsing import (
    ACTION_PATTERN,
    ALL_RESPONSE_PATTERN,
    THINK_ACTION_PATTERN,
    ParsedAction,
    parse_action,
)
from roll.agentic.env.registry import ENVS, check_env, make_env, register_env, resolve_env_factory
from roll.agentic.env.sokoban import SokobanEnv

__all__ = [
    "ACTION_PATTERN",
    "ALL_RESPONSE_PATTERN",
    "ENVS",
    "THINK_ACTION_PATTERN",
    "ArithmeticEnv",
    "Env",
    "EnvLike",
    "EnvOutputError",
    "FrozenLakeEnv",
    "ParsedAction",
    "SokobanEnv",
    "check_env",
    "check_reset_output",
    "check_step_output",
    "info_flag",
    "make_env",
    "make_tool_math_env",
    "parse_action",
    "register_env",
    "resolve_env_factory",
]
