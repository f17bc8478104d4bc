"""ROLL's ``sokoban_sandbox`` env type: Sokoban played through a game server in a sandbox (see :mod:`.env`), roll's
server and client for its image (:mod:`.app`), a ROCK sandbox (:mod:`.rock_sandbox`, the one module that imports ROCK's
SDK) and a stand-in on this machine (:mod:`.local`)."""

from __future__ import annotations

from roll.agentic.env.sokoban_sandbox.env import GameSandbox, SandboxGameError, SokobanSandboxConfig, SokobanSandboxEnv

__all__ = ["GameSandbox", "SandboxGameError", "SokobanSandboxConfig", "SokobanSandboxEnv"]
