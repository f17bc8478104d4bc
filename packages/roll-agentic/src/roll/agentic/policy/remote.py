"""One policy client shared by many processes: host it in a Ray actor, reach it with :class:`RemotePolicyClient`.

Used when EnvironmentWorkers should pool their requests into one queue (e.g. one :class:`ClusterPolicyClient`
batching for all of them) instead of each holding its own client.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from roll.agentic._ray_calls import await_call
from roll.agentic.policy.gate import PauseTimeoutError
from roll.agentic.policy.protocol import GenerateRequest, GenerateResult, PolicyClient

__all__ = ["PolicyServer", "RemotePolicyClient", "serve_policy"]


class PolicyServer:
    """Ray actor body: forwards every request to the hosted client on the actor's event loop."""

    def __init__(self, client: PolicyClient) -> None:
        self.client = client
        # Ray warns at the first ray.get in an async actor's process, on any thread: a ClusterPolicyClient's engine
        # calls wait on a worker thread (asyncio.to_thread), never on the loop, so the warning (on the run's console)
        # would be wrong here
        os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self.client.generate(request)

    def set_policy_version(self, version: int) -> None:
        setter = getattr(self.client, "set_policy_version", None)
        if setter is None:
            raise TypeError(f"{type(self.client).__name__} has no set_policy_version")
        setter(version)

    async def pause(self, timeout_s: float | None = None) -> int:
        """Stop new requests and wait for the started ones, at most ``timeout_s`` (a :class:`GatedPolicyClient`
        only). Returns how many were still running when the time ran out (0: paused): a count crosses Ray intact,
        where an exception would come back wrapped in a task error."""
        try:
            await self.client.pause(timeout_s)  # type: ignore[attr-defined]
        except PauseTimeoutError as e:
            return int(e.running or 0)
        return 0

    def resume(self, version: int | None = None) -> None:
        self.client.resume(version)  # type: ignore[attr-defined]


def serve_policy(client: PolicyClient, *, name: str | None = None, max_concurrency: int = 10_000) -> Any:
    """Start a PolicyServer actor hosting ``client`` (shipped by pickling) and return its handle."""
    options: dict[str, Any] = {"max_concurrency": max_concurrency, "num_cpus": 0}
    if name is not None:
        options["name"] = name
    return ray.remote(PolicyServer).options(**options).remote(client)


class RemotePolicyClient:
    """A PolicyClient that forwards to a PolicyServer actor; picklable, so it can be handed to workers."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result: GenerateResult = await await_call(self.server.generate.remote(request))
        return result
