"""GenerationConfig -> vLLM requests, and vLLM outputs -> token lists, log-probs and finish reasons.

Every sample is its own request (prompt i repeated n times, ``n=1`` each): vLLM refuses ``n > 1`` with greedy
decoding, and explicit requests keep the row order (sample j of prompt i at ``i * n + j``) without relying on
vLLM's ordering of a request's completions. Prefix caching shares the repeated prompt's prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roll.strategies.config import GenerationConfig
from roll.strategies.contract import StrategyError

__all__ = [
    "GeneratedSample",
    "build_requests",
    "parse_completions",
    "parse_prompt_logprobs",
    "request_errors",
    "scoring_params",
]

GeneratedSample = tuple[list[int], list[float] | None, str]


def request_errors() -> tuple[type[Exception], ...]:
    """Exceptions vLLM raises for a bad request (as opposed to an engine failure)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM: validation errors are plain ValueErrors
        return (ValueError,)
    return (ValueError, VLLMClientError)


def _sampling_kwargs(config: GenerationConfig) -> dict[str, Any]:
    """SamplingParams keyword arguments shared by every sample of a generate call."""
    return {
        "n": 1,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": 0 if config.top_k == -1 else config.top_k,  # vLLM's "disabled" is 0
        "min_p": config.min_p,
        "repetition_penalty": config.repetition_penalty,
        "max_tokens": config.max_new_tokens,
        "stop": list(config.stop_strings) or None,
        "stop_token_ids": list(config.stop_token_ids) or None,
        "ignore_eos": config.ignore_eos,
        # 0 extra alternatives: only the sampled token's log-prob comes back.
        "logprobs": 0 if config.logprobs else None,
        # Token ids always keep the token that completed a stop string (as HF's StopStringCriteria does);
        # this only makes the (unused) text agree with them.
        "include_stop_str_in_output": True,
        # Text is needed only to find stop strings.
        "detokenize": bool(config.stop_strings),
    }


def build_requests(
    prompts: Sequence[list[int]], config: GenerationConfig, seeds: Sequence[int] | None = None
) -> tuple[list[dict[str, list[int]]], Any]:
    """vLLM prompts and SamplingParams (one shared object, or one per request when seeded) for all samples.

    ``seeds`` (one per sample, from :func:`~roll.strategies.generation.sample_seeds`): each request samples from a
    generator of its own seed, whatever else the engine runs with it. Otherwise, with ``config.seed`` set, sample j
    of prompt i gets seed ``seed + i * n + j``: reproducible, yet prompts do not share one random stream (which
    would correlate their samples).
    """
    from vllm import SamplingParams

    n = config.num_return_sequences
    requests = [{"prompt_token_ids": list(prompt)} for prompt in prompts for _ in range(n)]
    if seeds is not None and len(seeds) != len(requests):
        raise StrategyError(f"build_requests: {len(seeds)} seeds for {len(requests)} samples")
    if config.greedy:
        seeds = None
    elif seeds is None and config.seed is not None:
        seeds = [config.seed + index for index in range(len(requests))]
    kwargs = _sampling_kwargs(config)
    try:
        if seeds is None:
            return requests, SamplingParams(**kwargs)
        params = [SamplingParams(**kwargs, seed=seed) for seed in seeds]
    except request_errors() as e:
        raise StrategyError(f"vLLM rejected the generation config: {e}") from e
    return requests, params


def parse_completions(outputs: Sequence[Any], want_logprobs: bool) -> list[GeneratedSample]:
    """(token ids, log-probs of the sampled tokens or None, "stop" | "length") for each request output."""
    samples: list[GeneratedSample] = []
    for output in outputs:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        log_probs = None
        if want_logprobs:
            if completion.logprobs is None or len(completion.logprobs) < len(tokens):
                raise StrategyError("vLLM returned no log-prob for some sampled tokens; this is a vLLM bug")
            log_probs = [float(step[token].logprob) for step, token in zip(completion.logprobs, tokens)]
        # vLLM also reports "abort" / "repetition"; the contract knows only budget exhaustion and stopping.
        reason = "length" if completion.finish_reason == "length" else "stop"
        samples.append((tokens, log_probs, reason))
    return samples


def scoring_params() -> Any:
    """SamplingParams that score a prompt's own tokens (one throwaway greedy token is generated)."""
    from vllm import SamplingParams

    # prompt_logprobs=0: each position returns just the actual token's log-prob (always raw, temperature 1).
    return SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)


def parse_prompt_logprobs(output: Any, tokens: Sequence[int]) -> list[float]:
    """log p(token_t | tokens_<t) for every position of a scored prompt (0 for the first token)."""
    entries = output.prompt_logprobs
    if entries is None or len(entries) != len(tokens):
        raise StrategyError("vLLM returned no prompt log-probs for a scored row; this is a vLLM bug")
    values = [0.0]
    for entry, token in zip(entries[1:], tokens[1:]):
        values.append(float(entry[token].logprob))
    return values
