"""Per-request generation: one sample at a time, resumable from a generated prefix (partial rollouts).

A request is one sample of one prompt. It may be generated in *segments*: a segment continues the request from
its ``prefix_ids`` (tokens already generated, possibly under older weights) for at most ``max_new_tokens``
more tokens. At a weight sync the scheduler stops issuing segments, lets the running ones end (at most a
segment's tokens), copies the weights, and resumes each unfinished request with its prefix under the new
weights: tokens and their log-probs are kept and the version boundary is recorded by the caller.

:func:`generate_requests` runs requests on any generating :class:`~roll.strategies.InferenceStrategy` (HF,
vLLM, SGLang, mock) through its ordinary ``generate``. Requests of one call that continue the same tokens with the
same settings (the samples of one prompt) are sampled together, as ``num_return_sequences`` rows of one
``generate``, seeded with the first one's seed.

The agentic layer's PolicyClient protocol mirrors these types; it can reuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from roll.protocol import DataProto
from roll.strategies.config import GenerationConfig

if TYPE_CHECKING:
    from roll.strategies.base import InferenceStrategy

__all__ = ["FinishReason", "GenerateRequest", "GenerateResult", "generate_requests"]

FinishReason = Literal["stop", "length", "abort"]
"""``stop``: the model ended the response (EOS or a stop string); ``length``: the request's whole budget is used;
``abort``: the segment ended before either (its budget was cut for a weight sync); resume it with its prefix."""


@dataclass(frozen=True)
class GenerateRequest:
    """One segment of one sample to generate."""

    request_id: str
    prompt_ids: list[int]
    generation_config: GenerationConfig
    """Sampling settings; ``max_new_tokens`` is the whole response budget, ``num_return_sequences`` is ignored."""
    prefix_ids: list[int] = field(default_factory=list)
    prefix_log_probs: list[float] = field(default_factory=list)
    segment_tokens: int | None = None
    """At most this many new tokens in this segment (None: the rest of the budget)."""
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def budget_left(self) -> int:
        return self.generation_config.max_new_tokens - len(self.prefix_ids)

    def resumed(self, result: GenerateResult) -> GenerateRequest:
        """The next segment after ``result`` (an ``abort``): the prefix grows, the seed moves on."""
        seed = None if self.seed is None else self.seed + 1
        return GenerateRequest(
            self.request_id,
            self.prompt_ids,
            self.generation_config,
            self.prefix_ids + result.token_ids,
            self.prefix_log_probs + list(result.log_probs or []),
            self.segment_tokens,
            seed,
            self.meta,
        )


@dataclass(frozen=True)
class GenerateResult:
    """The tokens one segment added (``token_ids``), with their log-probs under the sampling temperature."""

    request_id: str
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: FinishReason
    policy_version: int = 0
    """The weights that produced these tokens (the count of weight syncs), stamped by whoever knows it."""


def _segment_config(request: GenerateRequest) -> GenerationConfig:
    budget = request.budget_left
    if request.segment_tokens is not None:
        budget = min(budget, request.segment_tokens)
    return request.generation_config.model_copy(
        update={"max_new_tokens": max(1, budget), "num_return_sequences": 1, "seed": request.seed}
    )


def _prompt_batch(ids: list[int], pad_token_id: int) -> DataProto:
    del pad_token_id  # one row: no padding
    row = torch.tensor([ids], dtype=torch.long)
    return DataProto.from_dict({"input_ids": row, "attention_mask": torch.ones_like(row)})


def _batch_key(request: GenerateRequest) -> tuple[Any, ...]:
    return (tuple(request.prompt_ids), tuple(request.prefix_ids), request.segment_tokens, request.generation_config)


def generate_requests(
    strategy: InferenceStrategy, requests: Sequence[GenerateRequest], *, pad_token_id: int, policy_version: int = 0
) -> list[GenerateResult]:
    """One segment of each request, in order (see the module docstring)."""
    runs: list[list[GenerateRequest]] = []
    for request in requests:
        if request.budget_left <= 0:
            raise ValueError(f"request {request.request_id} has no budget left ({len(request.prefix_ids)} tokens)")
        if runs and _batch_key(runs[-1][0]) == _batch_key(request):
            runs[-1].append(request)
        else:
            runs.append([request])
    results: list[GenerateResult] = []
    for run in runs:
        first = run[0]
        config = _segment_config(first).model_copy(update={"num_return_sequences": len(run)})
        out = strategy.generate(_prompt_batch(first.prompt_ids + first.prefix_ids, pad_token_id), config)
        for row, request in enumerate(run):
            mask = out.batch["response_mask"][row].bool()
            tokens = out.batch["responses"][row][mask].tolist()
            log_probs = out.batch["rollout_log_probs"][row][mask].tolist() if config.logprobs else None
            reason = str(out.non_tensor_batch["finish_reason"][row])
            if reason == "length" and len(request.prefix_ids) + len(tokens) < request.generation_config.max_new_tokens:
                reason = "abort"  # only the segment's budget ran out: the request goes on
            results.append(GenerateResult(request.request_id, tokens, log_probs, reason, policy_version))  # type: ignore[arg-type]
    return results
