"""Replaying an episode's responses through an Atropos env (needs ``atroposlib``; imported only by
:mod:`roll.agentic.env.atropos.env` once the extra is known to be there).

An Atropos env runs a whole trajectory in ``collect_trajectories(item)``, calling its inference servers whenever it
wants a model response. :func:`replay` runs that method with the env's servers swapped for a :class:`ReplayServer`,
which answers the n-th model call with the episode's n-th response and, at the call past the last response, records
what the env asked (its chat messages and tools: the next observation) and stops the trajectory there. A turn of
roll's env is therefore one more replay of the episode from its item, with one more response.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from atroposlib.envs.base import BaseEnv
from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_baseline import AsyncSemWithAdaptiveWeight
from atroposlib.envs.server_handling.server_harness import create_chat_completion, create_completion

__all__ = ["Replay", "ReplayServer", "replay"]

# Slots the server stand-in offers to Atropos's ServerManager, which waits for a free one before each call.
_SLOTS = 1024


class TurnBoundary(BaseException):
    """Stops the env's trajectory at the model call past the replayed responses. A BaseException, so that an env's
    own ``except Exception`` around its model calls does not swallow it (the boundary is also recorded on the
    server, so an env that catches everything is still seen to have asked)."""


class ReplayServer:
    """Stands in for an Atropos inference server: the n-th model call gets ``responses[n]``; the call after the last
    sets :attr:`asked` (and :attr:`tools`) and raises :class:`TurnBoundary`."""

    def __init__(self, responses: Sequence[str], tokenizer: Any) -> None:
        self.responses = list(responses)
        self.tokenizer = tokenizer
        self.calls = 0
        self.asked: list[dict[str, Any]] | None = None
        self.tools: list[dict[str, Any]] = []
        #: Set by the managed server before it renders a chat into the prompt this server then sees.
        self.pending: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        # What Atropos's ServerManager and ManagedServer read of a server.
        self.config = SimpleNamespace(model_name="roll-policy")
        self.server_healthy = True
        self.sem = AsyncSemWithAdaptiveWeight(_SLOTS)
        self.eval_sem = AsyncSemWithAdaptiveWeight(_SLOTS)

    def _next(self, messages: list[dict[str, Any]], tools: Any) -> str:
        if self.calls >= len(self.responses):
            self.asked = [dict(m) for m in messages]
            self.tools = list(tools or [])
            raise TurnBoundary
        self.calls += 1
        return self.responses[self.calls - 1]

    async def chat_completion(self, **kwargs: Any) -> Any:
        text = self._next(list(kwargs.get("messages") or []), kwargs.get("tools"))
        return create_chat_completion(text, n=int(kwargs.get("n") or 1))

    async def completion(self, **kwargs: Any) -> Any:
        text = self._next([{"role": "user", "content": str(kwargs.get("prompt", ""))}], None)
        return create_completion(text, n=int(kwargs.get("n") or 1))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> tuple[list[int], list[Any], list[Any], list[str]]:
        prompt = str(kwargs.get("prompt", ""))
        messages, tools = self.pending or ([{"role": "user", "content": prompt}], [])
        self.pending = None
        text = self._next(messages, tools)
        # The managed server decodes these ids back into the response text with the env's tokenizer.
        tokens = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]
        prompt_tokens = kwargs.get("input_ids") or self.tokenizer.encode(prompt, add_special_tokens=False)
        n = int(kwargs.get("n") or 1)
        return list(prompt_tokens), [list(tokens) for _ in range(n)], [[0.0] * len(tokens)] * n, ["stop"] * n

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        return {"prompt_tokens": [], "prompt_topk_token_ids": [], "prompt_topk_logprobs": []}

    async def update_weight(self, weight: float) -> None:
        return None


class _ReplayManaged(ManagedServer):
    """Atropos's ManagedServer over a :class:`ReplayServer`, telling it the chat before rendering it to a prompt
    (the server then records messages, not their rendering, when the env asks past the responses)."""

    async def chat_completion(self, **kwargs: Any) -> Any:
        self.server.pending = (list(kwargs.get("messages") or []), list(kwargs.get("tools") or []))
        return await super().chat_completion(**kwargs)

    async def completion(self, **kwargs: Any) -> Any:
        self.server.pending = None
        return await super().completion(**kwargs)


@dataclass
class Replay:
    """What one replay ended with: the env asked again (``asked``, its messages, and ``tools``) or finished
    (``result``, what ``collect_trajectories`` returned: a ScoredDataGroup, a list of them, or None)."""

    asked: list[dict[str, Any]] | None
    tools: list[dict[str, Any]]
    result: Any
    calls: int


async def replay(env: BaseEnv, item: Any, responses: Sequence[str]) -> Replay:
    """Run ``env.collect_trajectories(item)`` with ``responses`` as the model's answers, in order."""
    server = ReplayServer(responses, env.tokenizer)
    manager = env.server

    @contextlib.asynccontextmanager
    async def managed_server(
        tokenizer: Any = None, base_url: str | None = None, preserve_think_blocks: bool = False
    ) -> AsyncIterator[ManagedServer]:
        managed = _ReplayManaged(
            server=server,  # type: ignore[arg-type]
            tokenizer=tokenizer or env.tokenizer,
            tool_parser=getattr(manager, "tool_parser", None),
            preserve_think_blocks=preserve_think_blocks,
        )
        try:
            yield managed
        finally:
            managed.reset()

    saved = manager.servers
    manager.servers = [server]
    manager.managed_server = managed_server  # an instance attribute: shadows the method for this replay only
    result: Any = None
    try:
        result, _backlog = await env.collect_trajectories(item)
    except TurnBoundary:
        pass
    except BaseExceptionGroup as group:  # a TaskGroup inside the env wraps it
        if server.asked is None or not group.subgroup(TurnBoundary):
            raise
    finally:
        manager.servers = saved
        vars(manager).pop("managed_server", None)
    if server.asked is not None:
        return Replay(server.asked, server.tools, None, server.calls)
    return Replay(None, [], result, server.calls)
