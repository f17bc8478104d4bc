"""Env managers: play one environment's episodes against a PolicyClient and lay them out as training samples.

One manager owns one env instance (one "env slot"); :meth:`EnvManager.run_episode` plays a whole episode:
reset with the task's seed, then per turn build the prompt, send one request (seeded by :func:`turn_seed` from the
task's ``sampling_seed``), step the env with the decoded response, until the env ends the episode or a limit does.
Subclasses decide the prompt of each turn and the sample layout (:mod:`.traj`: one row per episode; :mod:`.step`:
one row per turn).

Why an episode ended (``end_reason``): ``terminated``/``truncated`` (the env said so), ``max_steps`` (turn limit),
``context_limit`` (the next turn would not fit in ``sequence_length``; a first turn that does not fit is a
configuration error, raised), ``token_limit`` (``max_tokens_per_traj``
spent), ``aborted`` (the policy server dropped a request), or an env fault (``env_error``, ``env_timeout``,
``env_malformed``). Faulted and aborted episodes yield no samples; everything else does.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env.base import info_flag
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.env_manager.runner import FAULT_REASONS, EnvFault, EnvRunner
from roll.agentic.policy.protocol import ChatTools, GenerateRequest, PolicyClient
from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig

__all__ = ["EnvManager", "EpisodeResult", "EpisodeState", "EpisodeTask", "Turn", "stable_seed", "turn_seed"]


@dataclass(frozen=True)
class EpisodeTask:
    """One episode to play: which env slot, which seed, and its ids (all members of a group share the seed)."""

    env_id: int
    group_id: int
    tag: str
    episode_id: int
    seed: int
    traj_group_id: str
    traj_id: str
    sampling_seed: int | None = None
    """Base of the seeds of this episode's turns (:func:`turn_seed`); None: its requests carry no seed."""


@dataclass
class Turn:
    prompt_ids: list[int]
    """Tokens added before this turn's response (trajectory-wise: the continuation; step-wise: the whole prompt)."""
    response_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    policy_version: int
    observation: str
    """The observation the model acted on."""
    response_text: str
    reward: float = 0.0
    action_valid: bool | None = None
    next_is_tool_result: bool = False
    tool_calls: list[dict[str, Any]] | None = None
    """A chat endpoint's structured calls of this turn (``response_text`` holds them written in the env's format)."""
    content: str = ""
    """With ``tool_calls``: the answer's own text before them."""
    metrics: dict[str, float] = field(default_factory=dict)
    state_hash: str = ""


@dataclass
class EpisodeState:
    task: EpisodeTask
    observation: str = ""
    instruction: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    """Trajectory-wise: every token of the conversation so far."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The next turn's prompt as chat messages, kept by :meth:`EnvManager.build_prompt` only for a client that
    sends messages (``wants_messages``: a chat proxy); empty otherwise."""
    generated: int = 0


@dataclass
class EpisodeResult:
    """How an episode went, and its samples (``batch``; ``None`` for faulted, aborted or empty episodes)."""

    task: EpisodeTask
    end_reason: str
    num_turns: int
    success: bool
    episode_score: float
    format_ratio: float | None
    """Share of turns whose action parsed (``None``: the env does not report ``action_is_valid``)."""
    batch: DataProto | None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def faulted(self) -> bool:
        return self.end_reason in FAULT_REASONS

    @classmethod
    def unplayed(cls, task: EpisodeTask, reason: str, error: str) -> EpisodeResult:
        """An episode that ended before its first turn (its env did not build or reset): no turns, no samples."""
        metrics = dict.fromkeys(("success", "num_turns", "episode_score", "generated_tokens"), 0.0)
        return cls(task, reason, 0, False, 0.0, None, None, metrics, error)


def _aggregate(turns: list[Turn], modes: dict[str, str]) -> dict[str, float]:
    """Per-episode values of the env's step metrics: mean by default, or ``modes[key]`` in last/sum/max/min."""
    values: dict[str, list[float]] = {}
    for turn in turns:
        for key, value in turn.metrics.items():
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                values.setdefault(key, []).append(float(value))
    reducers: dict[str, Callable[[list[float]], float]] = {"last": lambda v: v[-1], "sum": sum, "max": max, "min": min}
    return {key: reducers.get(modes.get(key, "mean"), lambda v: sum(v) / len(v))(v) for key, v in values.items()}


def stable_seed(*parts: object) -> int:
    """A 31-bit seed that is a stable, well-mixed function of ``parts`` (the same in every process and run)."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def turn_seed(sampling_seed: int, turn: int, generation_seed: int | None) -> int:
    """The sampling seed of an episode's ``turn``: a stable hash of the episode's sampling seed, the turn and
    ``generating_args.seed`` (when set, changing it changes every sample)."""
    return stable_seed(sampling_seed, turn, generation_seed)


class EnvManager(ABC):
    """Plays episodes of one env slot. Subclasses implement :meth:`build_prompt` and :meth:`formulate`."""

    def __init__(
        self,
        *,
        tag: str,
        spec: CustomEnvConfig,
        runner: EnvRunner,
        formatter: ChatFormatter,
        client: PolicyClient,
        generation_config: GenerationConfig,
        sequence_length: int,
        pad_token_id: int,
    ) -> None:
        self.tag, self.spec, self.runner, self.formatter = tag, spec, runner, formatter
        self.client, self.generation_config = client, generation_config
        self.sequence_length, self.pad_token_id = sequence_length, pad_token_id
        # a chat endpoint (llm_proxy openai, api: chat) reads the messages; other clients never get a copy
        self.send_messages = bool(getattr(client, "wants_messages", False))

    # --- subclass hooks ---------------------------------------------------------------------------------
    @abstractmethod
    def build_prompt(self, state: EpisodeState) -> tuple[list[int], list[int]]:
        """``(turn_prompt_ids, model_input_ids)`` for the next turn (see :attr:`Turn.prompt_ids`); called once per
        turn; when :attr:`send_messages` (a chat proxy), it also leaves the conversation those ids render, as chat
        messages, in ``state.messages``."""

    @abstractmethod
    def formulate(self, state: EpisodeState, result: EpisodeResult) -> DataProto:
        """The samples of a finished episode."""

    def chat_tools(self, state: EpisodeState) -> ChatTools | None:
        """The env's tools for a chat endpoint (sent with the messages): its ``chat_tools()`` (a tool wrapper has
        one), or None for an env without tools."""
        method = getattr(self.runner.env, "chat_tools", None)
        return method() if callable(method) else None

    def observe(self, state: EpisodeState, turn: Turn) -> None:  # noqa: B027 - optional hook
        """Called after each turn is recorded (trajectory-wise managers extend the context)."""

    # --- episode loop -----------------------------------------------------------------------------------
    def _budget(self, state: EpisodeState, context_length: int) -> tuple[int, str]:
        room = self.sequence_length - context_length
        if room <= 0:
            return 0, "context_limit"
        budget = min(self.spec.max_tokens_per_step, self.generation_config.max_new_tokens, room)
        if self.spec.max_tokens_per_traj is not None:
            left = self.spec.max_tokens_per_traj - state.generated
            if left <= 0:
                return 0, "token_limit"
            budget = min(budget, left)
        return budget, ""

    async def start(self, task: EpisodeTask) -> EpisodeState:
        """The env reset with ``task``'s seed: the state the first turn's prompt is built from (raises EnvFault)."""
        state = EpisodeState(task)
        state.observation, state.info = await self.runner.reset(task.seed)
        state.instruction = str(state.info.get("env_instruction", "") or "") if self.spec.show_env_instruction else ""
        return state

    async def run_episode(self, task: EpisodeTask) -> EpisodeResult:
        try:
            state = await self.start(task)
        except EnvFault as fault:
            return EpisodeResult.unplayed(task, fault.reason, str(fault))
        reason = "max_steps"
        while len(state.turns) < self.spec.max_steps:
            turn_prompt, model_input = self.build_prompt(state)
            budget, limit = self._budget(state, len(model_input))
            if limit == "context_limit" and not state.turns:
                raise ConfigError(
                    f"env tag {self.tag!r}: the first prompt (seed {task.seed}) is {len(model_input)} tokens and "
                    f"leaves nothing to generate within rollout.sequence_length={self.sequence_length} (ROLL's "
                    "sequence_length): raise it, or shorten the env's instruction and templates"
                )
            if limit:
                reason = limit
                break
            request = GenerateRequest(
                request_id=f"{task.traj_id}/{len(state.turns)}",
                prompt_ids=model_input,
                generation_config=self.generation_config.model_copy(update={"max_new_tokens": budget}),
                meta={"env_id": task.env_id, "group_id": task.group_id, "tag": task.tag, "traj_id": task.traj_id},
                seed=None
                if task.sampling_seed is None
                else turn_seed(task.sampling_seed, len(state.turns), self.generation_config.seed),
                messages=list(state.messages) if self.send_messages else None,
                tools=self.chat_tools(state) if self.send_messages else None,
            )
            try:
                result = await self.client.generate(request)
            except EnvFault as fault:  # a client that asks the env (llm_proxy random) can meet its faults
                return self._finish(state, fault.reason, str(fault))
            if result.finish_reason == "abort" or not result.token_ids:
                reason = "aborted"
                break
            log_probs = list(result.log_probs) if result.log_probs is not None else [0.0] * len(result.token_ids)
            turn = Turn(
                turn_prompt,
                list(result.token_ids),
                log_probs,
                result.finish_reason,
                result.policy_version,
                state.observation,
                self.formatter.decode(result.token_ids),
                tool_calls=result.tool_calls,
                content=result.content,
            )
            state.generated += len(turn.response_ids)
            try:
                observation, reward, terminated, truncated, info = await self.runner.step(turn.response_text)
            except EnvFault as fault:
                state.turns.append(turn)
                return self._finish(state, fault.reason, str(fault))
            turn.reward, turn.action_valid = reward, info_flag(info, "action_is_valid")
            turn.next_is_tool_result = bool(info.get("use_tool", False))
            turn.metrics = dict(info.get("metrics") or {})
            state.turns.append(turn)
            self.observe(state, turn)
            state.observation, state.info = observation, info
            if terminated or truncated:
                reason = "terminated" if terminated else "truncated"
                break
        return self._finish(state, reason)

    def _finish(self, state: EpisodeState, reason: str, error: str = "") -> EpisodeResult:
        turns = state.turns
        valid = [t.action_valid for t in turns if t.action_valid is not None]
        success = bool(info_flag(state.info, "success")) if turns and reason not in FAULT_REASONS else False
        result = EpisodeResult(
            task=state.task,
            end_reason=reason,
            num_turns=len(turns),
            success=success,
            episode_score=float(sum(t.reward for t in turns)),
            format_ratio=(sum(valid) / len(valid)) if valid else None,
            batch=None,
            error=error,
        )
        metrics = _aggregate(turns, dict(state.info.get("metrics_agg_mode") or {}))
        metrics.update(
            success=float(success),
            num_turns=float(len(turns)),
            episode_score=result.episode_score,
            generated_tokens=float(state.generated),
        )
        if result.format_ratio is not None:
            metrics["format"] = result.format_ratio
        result.metrics = metrics
        if turns and reason not in FAULT_REASONS and reason != "aborted":
            result.batch = self.formulate(state, result)
        return result

    # --- shared helpers for subclasses ------------------------------------------------------------------
    def common_columns(self, state: EpisodeState, result: EpisodeResult, rows: int) -> dict[str, list[Any]]:
        task = state.task
        versions = [t.policy_version for t in state.turns]
        per_row = {
            "traj_id": task.traj_id,
            "traj_group_id": task.traj_group_id,
            "tag": task.tag,
            "env_id": task.env_id,
            "group_id": task.group_id,
            "episode_id": task.episode_id,
            "episode_scores": result.episode_score,
            "success": result.success,
            "end_reason": result.end_reason,
            "num_turns": result.num_turns,
            "policy_version": min(versions) if versions else 0,
        }
        return {key: [value] * rows for key, value in per_row.items()}

    def close(self) -> None:
        self.runner.close()
