"""ROLL's ``sokoban_mcp``: text Sokoban whose game lives behind an MCP server at ``server_url``.

Needs ``pip install 'roll-agentic[mcp]'`` and a server: ``python -m roll.agentic.env.sokoban_mcp_server --port 8000``
(:mod:`roll.agentic.env.sokoban_mcp_server`) serves ``http://127.0.0.1:8000/sse`` (SSE, ROLL's transport) and
``http://127.0.0.1:8000/mcp`` (streamable HTTP, picked for a URL ending in ``/mcp``). ``reset(seed)`` calls the server's
``reset`` tool with ``{"seed": seed}``; ``step`` reads ``<answer>Up</answer>`` (``action_pattern``) with
``action_lookup`` and calls ``play`` with ``{"action": <id>}``; the server answers JSON text with ROLL's keys
``Observation`` (the room: the observation), ``Reward``, ``Game End`` and ``info`` (``success``,
``action_is_effective``, ...). A game that ends solved terminates, one that ends unsolved truncates, and so does the
``max_steps``-th turn. An answer that does not parse earns ``format_penalty`` and the server is not called.

The env holds one MCP session (:class:`~roll.agentic.tools.mcp.MCPTool`), opened at the first ``reset``, kept
across episodes, and closed by ``close()``; a session that died is opened again at the next ``reset``. Faults: a
server that does not answer at ``reset`` (nor after one reconnection), or answers something that is not the game's
JSON, makes ``reset`` raise an error naming ``server_url`` and the fix (the runner fails the episode:
``env_error``); a ``play`` call that fails or answers garbage ends the episode at once, truncated with reward 0,
``info["failure_mode"]`` saying why (as ``openreward_env``), and the session is reopened at the next ``reset``.

Follows ROLL's ``roll/pipeline/agentic/env/mcp/sokoban_mcp_env.py``; differences: ROLL's default
``special_token_list`` removes ``<answer>`` itself, so no answer ever parses (ours removes the chat tokens only, and a
list with a token ``action_pattern`` needs is a ConfigError); the ``max_steps``-th turn truncates (ROLL leaves it to
the env manager); the instructions carry the symbols' legend (ROLL writes it into a suffix it never shows).
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from roll.agentic.env.base import Env, ResetOutput, StepOutput
from roll.agentic.env.parsing import ACTION_PATTERN, parse_action
from roll.agentic.env.sokoban import GRID_VOCAB, INSTRUCTION, sokoban_instructions
from roll.runtime import ConfigError

__all__ = ["SokobanMCPEnv"]

logger = logging.getLogger(__name__)

ROLL_ACTION_LOOKUP = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
START_SERVER = (
    "start one with `python -m roll.agentic.env.sokoban_mcp_server --port 8000` (then server_url: "
    "http://127.0.0.1:8000/sse) or fix env_config.server_url"
)
_SAMPLER = random.Random()
_AGG = {"action_is_effective": "mean", "action_is_valid": "mean", "success": "last", "format_penalty": "mean"}


def _action_lookup(action_lookup: Mapping[Any, str]) -> dict[int, str]:
    """``action_lookup`` with int ids (YAML may give them as strings)."""
    try:
        lookup = {int(k): str(v) for k, v in action_lookup.items()}
    except (TypeError, ValueError):
        raise ConfigError(
            f"sokoban_mcp action_lookup={dict(action_lookup)!r}: its keys must be the server's action ids (integers)"
        ) from None
    if not lookup:
        raise ConfigError("sokoban_mcp action_lookup is empty; give the server's actions, e.g. {1: Up, 2: Down, ...}")
    return lookup


def _check_settings(
    server_url: str | None, action_pattern: str, special_token_list: Sequence[str], transport: str | None
) -> tuple[str, str]:
    """``(server_url, transport)`` once the settings fit; ConfigError naming the key and the fix otherwise."""
    from roll.agentic.tools.mcp import mcp_transport_of

    if not server_url:
        raise ConfigError(
            "sokoban_mcp needs env_config.server_url, the URL of a Sokoban MCP server: start one with `python -m "
            "roll.agentic.env.sokoban_mcp_server --port 8000` and set server_url: http://127.0.0.1:8000/sse"
        )
    for token in special_token_list:
        if token and token in action_pattern:
            raise ConfigError(
                f"sokoban_mcp special_token_list removes {token!r} before matching, but action_pattern "
                f"{action_pattern!r} needs it: no answer would parse; drop it from special_token_list"
            )
    parse_action("", action_pattern)  # a bad pattern is a ConfigError
    return server_url, mcp_transport_of(server_url, transport)


class SokobanMCPEnv(Env):
    """Sokoban played on an MCP server (ROLL's keys: ``server_url``, ``max_steps``, ``action_lookup``,
    ``env_instruction``, ``format_penalty``, ``action_pattern``, ``special_token_list``; ours: ``transport``,
    ``timeout_s``)."""

    def __init__(
        self,
        server_url: str | None = None,
        max_steps: int = 20,
        action_lookup: Mapping[Any, str] | None = None,
        env_instruction: str | None = None,
        format_penalty: float = -0.1,
        action_pattern: str = ACTION_PATTERN,
        special_token_list: Sequence[str] = SPECIAL_TOKENS,
        transport: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        from roll.agentic.tools.mcp import import_mcp

        self.server_url = _check_settings(server_url, action_pattern, special_token_list, transport)[0]
        import_mcp("the sokoban_mcp env")
        self.max_steps, self.format_penalty, self.action_pattern = max_steps, format_penalty, action_pattern
        self.action_lookup = _action_lookup(ROLL_ACTION_LOOKUP if action_lookup is None else action_lookup)
        self.special_token_list = tuple(special_token_list)
        self.env_instruction = INSTRUCTION if env_instruction is None else env_instruction
        self.transport, self.timeout_s = transport, timeout_s
        self._tool: Any = None  # the MCPTool holding the session
        self.observation = ""
        self.steps = 0

    @classmethod
    def check_args(
        cls,
        server_url: str | None = None,
        action_pattern: str = ACTION_PATTERN,
        special_token_list: Sequence[str] = SPECIAL_TOKENS,
        transport: str | None = None,
        **_: Any,
    ) -> str:
        """``roll validate``: ``server_url`` is set (and answers: a warning away from the run's machine), the action
        settings fit, the mcp extra is installed."""
        from roll.agentic.tools.mcp import import_mcp
        from roll.pipelines.validate import ping_service

        url, transport = _check_settings(server_url, action_pattern, special_token_list, transport)
        import_mcp("the sokoban_mcp env")
        ping_service(url, f"sokoban_mcp's server_url {url!r}", START_SERVER, method="HEAD")
        return f"Sokoban MCP server {url} ({transport})"

    # --- episode ------------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> ResetOutput:
        answer = self._reset_call({} if seed is None else {"seed": seed})
        self.observation, self.steps = answer["Observation"], 0
        return self.observation, {"env_instruction": self.instructions(), "success": False}

    def step(self, action: str) -> StepOutput:
        if self._tool is None:
            raise RuntimeError("SokobanMCPEnv.step() before reset()")
        self.steps += 1
        parsed = parse_action(action, self.action_pattern, self.action_lookup.values(), self.special_token_list)
        if parsed.action is None:
            info = self._info(valid=False, effective=False, success=False, penalty=self.format_penalty)
            info["action_desc"] = f"At turn {self.steps}, you provided an invalid action."
            return self.observation, self.format_penalty, False, self.steps >= self.max_steps, info
        action_id = next(k for k, v in self.action_lookup.items() if v == parsed.action)
        result = self._tool.call("play", {"action": action_id})
        try:
            answer = self._read(result.output) if result.ok else None
        except ValueError as e:
            return self._failed(f"bad_answer: {e}")
        if answer is None:
            return self._failed(f"tool_call_failed: play: {result.output}")
        self.observation = answer["Observation"]
        server_info = answer["info"]
        success, effective = bool(server_info.get("success")), bool(server_info.get("action_is_effective"))
        game_end = bool(answer["Game End"])
        info = self._info(valid=True, effective=effective, success=success, penalty=0.0)
        moved = f"moved {parsed.action}, which was" if effective else f"tried to move {parsed.action}, which was not"
        info["action_desc"] = f"At turn {self.steps}, you {moved} effective."
        info["reward_from_server"] = answer["Reward"]
        terminated = game_end and success
        truncated = not terminated and (game_end or self.steps >= self.max_steps)
        return self.observation, answer["Reward"], terminated, truncated, info

    def instructions(self) -> str:
        return sokoban_instructions(self.env_instruction, GRID_VOCAB, self.action_lookup.values())

    def render(self) -> str:
        return self.observation

    def close(self) -> None:
        """Close the MCP session. Safe to call twice."""
        tool, self._tool = self._tool, None
        if tool is not None:
            tool.close()

    # --- the server ---------------------------------------------------------------------------------------------
    def _connect(self) -> Any:
        from roll.agentic.tools.mcp import MCPTool, MissingMCPToolsError
        from roll.pipelines.validate import ServiceUnreachableError

        try:
            return MCPTool(
                server_url=self.server_url,
                transport=self.transport,
                tool_names=["reset", "play"],
                timeout_s=self.timeout_s,
                startup_timeout_s=self.timeout_s,
            )
        except MissingMCPToolsError as e:
            raise ConfigError(
                f"sokoban_mcp: server_url {self.server_url!r} is not a Sokoban MCP server ({e}); {START_SERVER}"
            ) from e
        except ConfigError as e:  # the session did not start
            cause = e.__cause__ if e.__cause__ is not None else e
            raise ServiceUnreachableError(
                f"sokoban_mcp: the MCP server at server_url {self.server_url!r} does not answer "
                f"({type(cause).__name__}: {_first_error(cause)}); {START_SERVER}"
            ) from e

    def _reset_call(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The server's answer to ``reset``; a dead session is opened again once."""
        for attempt in (0, 1):
            if self._tool is None or not self._tool.connected:
                self.close()
                self._tool = self._connect()
            result = self._tool.call("reset", arguments)
            if result.ok:
                break
            self.close()
            if attempt == 1:
                raise ConfigError(
                    f"sokoban_mcp: the reset call to server_url {self.server_url!r} failed ({result.output}); "
                    f"{START_SERVER}"
                )
        try:
            return self._read(result.output)
        except ValueError as e:
            raise ConfigError(
                f"sokoban_mcp: server_url {self.server_url!r} is not a Sokoban MCP server ({e}); {START_SERVER}"
            ) from None

    @staticmethod
    def _read(text: str) -> dict[str, Any]:
        """The game's JSON answer, or ValueError saying what is wrong with it."""
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"its answer is not JSON: {text[:200]!r}") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("Observation"), str):
            raise ValueError(f"its answer has no 'Observation' text: {text[:200]!r}")
        reward = answer.get("Reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"its 'Reward' is not a number: {reward!r}")
        if not isinstance(answer.get("info", {}), dict):
            raise ValueError(f"its 'info' is not an object: {answer.get('info')!r}")
        return {
            "Observation": answer["Observation"],
            "Reward": float(reward),
            "Game End": bool(answer.get("Game End", False)),
            "info": dict(answer.get("info") or {}),
        }

    def _failed(self, failure: str) -> StepOutput:
        """End the episode after a failed ``play`` call; the session is reopened at the next reset."""
        logger.warning("sokoban_mcp at %s: %s", self.server_url, failure)
        self.close()
        info = self._info(valid=True, effective=False, success=False, penalty=0.0)
        info.update(failure_mode=failure, action_desc="System Error")
        return self.observation, 0.0, False, True, info

    @staticmethod
    def _info(*, valid: bool, effective: bool, success: bool, penalty: float) -> dict[str, Any]:
        metrics = {
            "action_is_valid": float(valid),
            "action_is_effective": float(effective),
            "success": float(success),
            "format_penalty": penalty,
        }
        return {
            "action_is_valid": valid,
            "action_is_effective": effective,
            "success": success,
            "metrics": metrics,
            "metrics_agg_mode": dict(_AGG),
        }

    def sample_random_action(self, seed: int | None = None) -> str:
        """A uniformly random action of ``action_lookup`` (a function of ``seed`` when given)."""
        rng = random.Random(seed) if seed is not None else _SAMPLER
        return f"<answer>{rng.choice(list(self.action_lookup.values()))}</answer>"


def _first_error(error: BaseException) -> str:
    """The first leaf of an exception group (the SDK's transports raise them), else the error's own text."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return str(error) or type(error).__name__
