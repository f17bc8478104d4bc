"""How environments reach the policy: one request per turn, answered as soon as the engine is done with it.

Env managers never batch: each conversation sends its turn when it is ready and awaits the answer, so generation
of one env overlaps the stepping of others. Whatever serves the requests (a latency-modelled mock, a batching
adapter over an inference Cluster, a per-request engine client) implements :class:`PolicyClient`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from roll.runtime import RollError
from roll.strategies import GenerationConfig

__all__ = ["ChatTools", "FinishReason", "GenerateRequest", "GenerateResult", "NoPolicyClient", "PolicyClient"]

FinishReason = Literal["stop", "length", "abort"]
"""``stop``: the model ended its turn (EOS or a stop condition); ``length``: ``max_new_tokens`` was reached;
``abort``: the server gave up on the request (e.g. a weight sync interrupted it); its tokens must not be used."""


@dataclass(frozen=True)
class ChatTools:
    """An env's tools as a chat endpoint sees them (``llm_proxy`` openai with ``api: chat``)."""

    schemas: list[dict[str, Any]]
    """OpenAI function schemas (``{"type": "function", "function": {"name", "description", "parameters"}}``), sent
    as the request's ``tools``."""
    write_call: Callable[[str, Any], str]
    """``write_call(name, arguments)``: one call as the text the env reads (its tool-call format); ``arguments`` is
    the parsed JSON object, or the endpoint's string when it is not one (the env then reports a failed call)."""


@dataclass(frozen=True)
class GenerateRequest:
    """One turn to generate."""

    request_id: str
    """Unique per request (env managers use ``"{traj_id}/{turn}"``); a deterministic mock seeds from it."""
    prompt_ids: list[int]
    """The whole model input: every token of the conversation so far, ending with the generation prompt."""
    generation_config: GenerationConfig
    """Sampling settings; ``max_new_tokens`` is already capped for this turn, ``num_return_sequences`` is 1."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Routing hints, not used for sampling: ``env_id``, ``group_id``, ``traj_id``, ``tag``."""
    seed: int | None = None
    """This request's own sampling seed (env managers derive it from the episode and the turn), or ``None``: the
    engine's generator. Engines that honour it (hf_infer, vllm, sglang) sample the same tokens for the same seed
    whatever other requests share the batch, so a run does not depend on when its requests arrived."""
    messages: list[dict[str, Any]] | None = None
    """The conversation ``prompt_ids`` renders, as chat messages (the last one the env's), for a client that sends
    messages rather than tokens (``llm_proxy`` openai with ``api: chat``); filled only when the client's
    ``wants_messages`` is true, ``None`` otherwise. An assistant message that called tools carries OpenAI
    ``tool_calls`` (ids stable within the episode) and is followed by one ``tool`` message per call."""
    tools: ChatTools | None = None
    """The env's tools, filled with ``messages`` when the env has any (a tool wrapper, an agent-native env's reset
    ``info["tools"]``, any env with a ``chat_tools()`` method)."""


@dataclass(frozen=True)
class GenerateResult:
    """The sampled continuation of one request."""

    request_id: str
    token_ids: list[int]
    """Exactly the sampled tokens, including the final EOS when the model stopped on it."""
    log_probs: list[float] | None
    """Log-probability of each sampled token under the sampling distribution (``None``: not available)."""
    finish_reason: FinishReason
    policy_version: int = 0
    """Version of the weights that generated it (the count of weight syncs), for staleness accounting."""
    tool_calls: list[dict[str, Any]] | None = None
    """A chat endpoint's structured tool calls (``{"name", "arguments"}``, arguments a JSON string), which
    ``token_ids`` hold written in the env's format after ``content``; ``None``: the answer called none natively."""
    content: str = ""
    """With ``tool_calls``: the answer's own text, before the calls."""


@runtime_checkable
class PolicyClient(Protocol):
    """Anything that answers one generation request at a time, concurrently with others."""

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...


class NoPolicyClient:
    """The client of a manager whose ``llm_proxy`` acts for it (``openai``, ``random``) in a run that serves no
    policy (``agentic_rollout`` starts no ``actor_infer`` then): a request reaching it is a bug, and says so."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        raise RollError(
            f"request {request.request_id!r} reached the policy, but this run serves none (llm_proxy acts every turn)"
        )
