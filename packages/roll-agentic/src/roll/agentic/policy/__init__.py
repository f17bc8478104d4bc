"""The policy side of rollouts: the per-request protocol, a latency-modelled mock, and adapters to roll clusters."""

from __future__ import annotations

from roll.agentic.policy.cluster import ClusterPolicyClient, prompts_to_batch
from roll.agentic.policy.gate import GatedPolicyClient, PauseTimeoutError
from roll.agentic.policy.mock import (
    LatencyModel,
    MockPolicyClient,
    MockStats,
    RandomActionPolicy,
    ScriptedPolicy,
    TextPolicy,
)
from roll.agentic.policy.openai_proxy import OpenAIProxyClient
from roll.agentic.policy.protocol import FinishReason, GenerateRequest, GenerateResult, NoPolicyClient, PolicyClient
from roll.agentic.policy.random_actions import RandomActionClient
from roll.agentic.policy.remote import PolicyServer, RemotePolicyClient, serve_policy

__all__ = [
    "ClusterPolicyClient",
    "FinishReason",
    "GatedPolicyClient",
    "GenerateRequest",
    "GenerateResult",
    "LatencyModel",
    "MockPolicyClient",
    "MockStats",
    "NoPolicyClient",
    "OpenAIProxyClient",
    "PauseTimeoutError",
    "PolicyClient",
    "PolicyServer",
    "RandomActionClient",
    "RandomActionPolicy",
    "RemotePolicyClient",
    "ScriptedPolicy",
    "TextPolicy",
    "prompts_to_batch",
    "serve_policy",
]
