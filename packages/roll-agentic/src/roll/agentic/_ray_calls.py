"""Awaiting a Ray call from asyncio so that cancelling the waiter also cancels the call."""

from __future__ import annotations

import asyncio
from typing import Any

import ray

__all__ = ["await_call"]


async def await_call(ref: Any) -> Any:
    """``await ref``; when the awaiting task is cancelled, cancel the remote call too (for an async actor's method,
    Ray cancels its asyncio task there). A plain ``await`` leaves the call running unobserved: an episode cancelled
    on the driver would go on playing on its EnvironmentWorker, and its generation requests would hold a weight
    sync's pause in the policy server."""
    try:
        return await ref
    except asyncio.CancelledError:
        ray.cancel(ref)
        raise
