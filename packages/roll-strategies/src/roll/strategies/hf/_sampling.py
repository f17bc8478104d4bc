"""Pieces hf_infer plugs into ``transformers`` generate(): logits processors, a stop-string check, response cuts.

Why hf_infer builds its own processor list instead of passing temperature/top_p/... to generate():
``_RawLogProbRecorder`` must see the *raw* model logits, so it has to run before every other processor, and
transformers appends user processors after the ones it builds itself. hf_infer therefore asks transformers for
no processor at all and supplies the whole chain, in a known order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import StoppingCriteria

from roll.strategies.config import GenerationConfig

__all__ = [
    "RawLogProbRecorder",
    "RepetitionPenalty",
    "ResponseStopStrings",
    "SampledRows",
    "SeededRowSampler",
    "build_logits_processors",
    "cut_responses",
    "seed_stream_keys",
    "stream_uniforms",
]


class RawLogProbRecorder(LogitsProcessor):
    """Records log p(sampled token) under softmax(raw_logits / temperature), holding one step of logits at a time.

    The raw logits are what a later forward pass over prompt + response reproduces (``ops.log_probs_from_logits``
    with the same temperature), so the rollout log-probs are comparable with the trainer's. Processed logits
    (after top-k/top-p/min-p/penalties) are deliberately not used: they are -inf outside the kept set and the
    trainer cannot recompute them. Step t's token is only known at step t+1 (it is then the last input id), so
    each call gathers the previous step's log-prob; :meth:`finish` gathers the last one.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self._pending: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        # A fresh tensor: later processors may not modify it, and the raw scores pass on unchanged.
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor, prompt_length: int) -> torch.Tensor:
        """Log-probs (rows, response length) of ``sequences[:, prompt_length:]`` on the CPU, float32."""
        length = sequences.shape[1] - prompt_length
        if len(self._steps) < length and self._pending is not None:
            last = sequences[:, prompt_length + len(self._steps)].unsqueeze(-1)
            self._steps.append(self._pending.gather(-1, last).squeeze(-1))
        self._pending = None
        if not self._steps or length <= 0:
            return torch.zeros((sequences.shape[0], max(length, 0)), dtype=torch.float32)
        # transformers may run extra decode steps and drop their tokens afterwards: keep only kept tokens.
        return torch.stack(self._steps[:length], dim=1).float().cpu()


class RepetitionPenalty(LogitsProcessor):
    """vLLM-style repetition penalty over prompt and generated tokens, ignoring each row's left padding.

    Seen tokens' positive logits are divided by ``penalty`` and negative ones multiplied by it.
    """

    def __init__(self, penalty: float, pad_lengths: torch.Tensor) -> None:
        self.penalty = penalty
        self.pad_lengths = pad_lengths  # (rows,) leading padding columns of every row

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        valid = (positions.unsqueeze(0) >= self.pad_lengths.to(input_ids.device).unsqueeze(1)).to(torch.int32)
        # scatter_add (not scatter_) so a pad id that is also a real token still counts as seen.
        counts = torch.zeros(scores.shape, dtype=torch.int32, device=scores.device).scatter_add_(1, input_ids, valid)
        penalized = torch.where(scores > 0, scores / self.penalty, scores * self.penalty)
        return cast(torch.FloatTensor, torch.where(counts > 0, penalized, scores))


# splitmix64's constants (Steele, Lea, Flood 2014) as signed int64: torch has no uint64 arithmetic.
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX_1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX_2 = 0x94D049BB133111EB - 2**64


def _as_int64(value: int) -> int:
    """``value`` modulo 2**64 as a signed int64 (the same 64 bits)."""
    value &= 2**64 - 1
    return value - 2**64 if value >= 2**63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` on int64 is arithmetic: it copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors: a bijection of 64-bit words whose every output bit depends on every
    input bit. Integer shifts, xors and wrapping multiplies only, so every device computes the same bits."""
    x = (x ^ _shift_right(x, 30)) * _MIX_1
    x = (x ^ _shift_right(x, 27)) * _MIX_2
    return x ^ _shift_right(x, 31)


def seed_stream_keys(seeds: Sequence[int]) -> torch.Tensor:
    """The int64 key of every seed's stream (seeds are taken modulo 2**64)."""
    return _mix64(torch.tensor([_as_int64(int(seed)) for seed in seeds], dtype=torch.int64))


def stream_uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """Draw ``step`` (0, 1, ...) of every stream of ``keys``: float64 uniforms in [0, 1), on ``keys``' device.

    A counter-based generator: draw t of key k is the top 53 bits of ``mix64(k + (t + 1) * golden)``, i.e. splitmix64
    started at the key, computed for all rows at once without any generator state.
    """
    bits = _mix64(keys + _as_int64((step + 1) * _GOLDEN))
    return _shift_right(bits, 11).double() * 2.0**-53


class SeededRowSampler(LogitsProcessor):
    """Draws every row's next token from the row's own random stream; the last processor, with greedy generate().

    transformers samples a whole batch from one generator, so a row's tokens would depend on which rows share its
    batch and in what order. Here row i's draw at decode step t is a uniform computed from ``(seeds[i], t)`` alone
    (:func:`stream_uniforms`: a splitmix64 hash in int64 tensor arithmetic, vectorized over the rows on the logits'
    device, with no per-row generator and no host loop), inverted through the row's cumulative distribution:
    exact inverse-CDF sampling of the processed distribution, the one multinomial sampling would draw from. The
    weights are ``exp(score - max)`` in float32, each token's share as exact as the float32 logits it comes from
    (a token 104 nats below the top weighs 0, as in transformers' float32 softmax); they are summed in float64,
    because a float32 cdf holds values near 1 only to ~6e-8, coarser than a tail token's weight in a vocabulary of
    150k: those tokens would be drawn with the wrong probability, or never. The returned scores are 0 at the drawn
    token and -inf elsewhere, so generate()'s argmax takes it and transformers draws nothing. Integer hashing gives
    the same stream on every device (the cumsum's float64 rounding may still differ between devices in the last bits).

    What stays batch-dependent is the arithmetic of the logits: a batched forward (other rows, left padding) differs
    from a single-row one in the last bits, which moves a draw only when its uniform falls that close to a boundary
    of the cumulative distribution. Measured on the tiny "nano" and "small" models on a CPU (temperature 1, seeded
    requests of 64 tokens, each alone vs all in one batch vs in shuffled batches of 8): in float32 about one draw in
    10,000 moved (6 of 65,345 with these streams and the per-row generators before them, 0 of another 49,152;
    log-probs within 2.4e-5); in bfloat16, whose rounding of the logits is far coarser, 4-9% of draws moved (a
    request's tokens typically diverge after 4-8 of them). So float32 rollouts almost always repeat whatever the
    batching; bfloat16 ones only where the batches repeat (docs/results/agentic.md sections 63 and 65).
    """

    def __init__(self, seeds: Sequence[int]) -> None:
        self.keys = seed_stream_keys(seeds)
        self.step = 0
        # Reused across decode steps: on a CPU a fresh (rows, vocab) float64 buffer costs a page fault per 4 KiB.
        self._weights: torch.Tensor | None = None
        self._cdf: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != self.keys.shape[0]:
            raise ValueError(f"SeededRowSampler has {self.keys.shape[0]} seeds for {scores.shape[0]} rows")
        if self.keys.device != scores.device:
            self.keys = self.keys.to(scores.device)
        if self._weights is None or self._weights.shape != scores.shape or self._weights.device != scores.device:
            self._weights = torch.empty(scores.shape, dtype=torch.float32, device=scores.device)
            self._cdf = torch.empty(scores.shape, dtype=torch.float64, device=scores.device)
        weights, cdf = self._weights, cast(torch.Tensor, self._cdf)
        torch.sub(scores, scores.max(dim=-1, keepdim=True).values, out=weights).exp_()  # -inf scores weigh 0
        torch.cumsum(weights, dim=-1, dtype=torch.float64, out=cdf)
        total = cdf[:, -1:]
        uniforms = stream_uniforms(self.keys, self.step).unsqueeze(-1)
        self.step += 1
        # u * total may round up to total itself; below it, the first cdf entry above the target always exists and
        # belongs to a token of positive weight (its interval [cdf[i-1], cdf[i]) holds the target).
        targets = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
        drawn = torch.searchsorted(cdf, targets, right=True)
        chosen = torch.full_like(scores, float("-inf"))
        chosen.scatter_(1, drawn, 0.0)
        return cast(torch.FloatTensor, chosen)


def build_logits_processors(
    config: GenerationConfig,
    pad_lengths: torch.Tensor,
    recorder: RawLogProbRecorder | None,
    sampler: SeededRowSampler | None = None,
) -> LogitsProcessorList:
    """The full processor chain for ``config``: recorder, penalty, then (sampling only) the warpers and, for seeded
    rows, the ``sampler`` that draws the token."""
    processors: list[Any] = []
    if recorder is not None:
        processors.append(recorder)
    if config.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(config.repetition_penalty, pad_lengths))
    if not config.greedy:
        if config.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k > 0:
            processors.append(TopKLogitsWarper(top_k=config.top_k))
        if config.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=config.top_p))
        if config.min_p > 0.0:
            processors.append(MinPLogitsWarper(min_p=config.min_p))
        if sampler is not None:
            processors.append(sampler)
    return LogitsProcessorList(processors)


class ResponseStopStrings(StoppingCriteria):
    """Stops a row once its generated text (never the prompt) contains a stop string, as vLLM does.

    Only a tail window of tokens is decoded each step: every token carries at least one byte, so a stop string
    that the newest token completes lies within its UTF-8 length (plus margin) of the end. ``stop_lengths``
    records, per row, the response length at which a stop string was first completed (0 = never).
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str], prompt_length: int, rows: int) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.prompt_length = prompt_length
        self.window = max((len(s.encode("utf-8")) for s in self.stop_strings), default=1) + 4
        self.stop_lengths = torch.zeros(rows, dtype=torch.long)

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None, **kwargs: Any
    ) -> torch.BoolTensor:
        length = input_ids.shape[1] - self.prompt_length
        if length > 0 and self.stop_strings:
            start = max(self.prompt_length, input_ids.shape[1] - self.window)
            tails = input_ids[:, start:].tolist()
            for row, tail in enumerate(tails):
                if self.stop_lengths[row] == 0:
                    text = self.tokenizer.decode(tail, skip_special_tokens=False)
                    if any(s in text for s in self.stop_strings):
                        self.stop_lengths[row] = length
        return cast(torch.BoolTensor, (self.stop_lengths > 0).to(input_ids.device))


@dataclass
class SampledRows:
    """Cut responses of one generate() call: token lists, their log-probs and finish reasons."""

    responses: list[list[int]]
    log_probs: list[list[float]]
    finish_reasons: list[str]


def cut_responses(
    generated: torch.Tensor,
    log_probs: torch.Tensor | None,
    stop_token_ids: Sequence[int],
    string_stop_lengths: torch.Tensor | None,
) -> SampledRows:
    """Cut each row of ``generated`` (rows, L) right after its first stop token or completed stop string.

    The stopping token stays in the response; everything after it (padding, or tokens generated by rows that
    transformers kept running) is dropped. Rows that never stopped finish with "length".
    """
    rows, length = generated.shape
    cut = torch.full((rows,), length + 1, dtype=torch.long)  # length + 1 = no stop found
    if stop_token_ids and length:
        is_stop = torch.isin(generated, torch.tensor(list(stop_token_ids), dtype=generated.dtype))
        first = is_stop.int().argmax(dim=1) + 1
        cut = torch.where(is_stop.any(dim=1), torch.minimum(cut, first), cut)
    if string_stop_lengths is not None:
        cut = torch.where(string_stop_lengths > 0, torch.minimum(cut, string_stop_lengths), cut)
    stopped = cut <= length
    keep = torch.clamp(cut, max=length).tolist()
    tokens = generated.tolist()
    lps = log_probs.tolist() if log_probs is not None else [[] for _ in range(rows)]
    return SampledRows(
        responses=[row[:k] for row, k in zip(tokens, keep)],
        log_probs=[row[:k] for row, k in zip(lps, keep)],
        finish_reasons=["stop" if s else "length" for s in stopped.tolist()],
    )
