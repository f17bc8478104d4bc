"""Settings of the ``sglang`` backend, and the pure translations between roll and SGLang (no sglang import).

One worker owns one ``sglang.Engine`` spanning ``tp_size`` GPUs; data parallelism comes from having several
workers. The request/response translations live here (not in ``strategy``) so they are tested on machines
without SGLang, which needs CUDA.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from roll.runtime import RollModel
from roll.strategies.config import GenerationConfig
from roll.strategies.contract import OffloadTarget, StrategyError

__all__ = [
    "SglangConfig",
    "check_engine_result",
    "memory_tags",
    "parse_engine_output",
    "sampling_params",
    "sampling_requests",
]

# Engine arguments the strategy derives itself; setting them in engine_kwargs would desynchronize the role.
_RESERVED_ENGINE_KWARGS = {
    "model_path": "model_args.model_name_or_path",
    "tokenizer_path": "model_args.tokenizer_name_or_path",
    "tp_size": "strategy_config.tp_size",
    "tensor_parallel_size": "strategy_config.tp_size",
    "dp_size": "more workers (one engine per worker)",
    "data_parallel_size": "more workers (one engine per worker)",
    "pp_size": "strategy_config.tp_size (pipeline parallelism is not used)",
    "base_gpu_id": "device_mapping",
    "nnodes": "device_mapping (a worker whose devices span nodes runs its engine over them)",
    "node_rank": "device_mapping (a worker whose devices span nodes runs its engine over them)",
    "dist_init_addr": "nothing: roll picks it on the worker's node when the engine spans nodes",
    "trust_remote_code": "model_args.trust_remote_code",
}


class SglangConfig(RollModel):
    """``sglang.Engine`` settings; anything else SGLang's ServerArgs accepts goes in ``engine_kwargs``."""

    # One engine may run over several nodes (see the multi-node section of the strategy module); the runtime then
    # lets a worker own devices on more than one node.
    multi_node_engine: ClassVar[bool] = True

    tp_size: int = Field(default=1, ge=1, description="GPUs (tensor-parallel ranks) of each worker's engine.")
    mem_fraction_static: float = Field(
        default=0.8, gt=0.0, lt=1.0, description="Share of GPU memory for weights + KV cache."
    )
    context_length: int | None = Field(default=None, ge=1, description="Max prompt + response tokens.")
    max_running_requests: int | None = Field(default=None, ge=1)
    chunked_prefill_size: int | None = Field(default=None, description="-1 disables chunked prefill.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        default=None, description="None follows model_args.dtype."
    )
    attention_backend: str | None = Field(default=None, description="e.g. 'flashinfer', 'fa3', 'triton'.")
    disable_cuda_graph: bool = False
    enable_memory_saver: bool = Field(
        default=True, description="Needed for offload_states / load_states (release/resume memory occupation)."
    )
    load_format: str | None = Field(default=None, description="e.g. 'dummy' when weights always come by sync.")
    skip_tokenizer_init: bool = Field(default=False, description="True disables stop_strings.")
    log_level: str = "error"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra sglang ServerArgs fields.")

    @property
    def devices_per_worker(self) -> int:
        return self.tp_size

    def node_layout_problem(self, devices_per_node: Sequence[int]) -> str | None:
        """Why an engine cannot run with a worker's devices split ``devices_per_node`` over nodes, or None."""
        if len(set(devices_per_node)) > 1:
            return (
                f"an sglang engine over {len(devices_per_node)} nodes needs the same number of devices on each node "
                f"(SGLang splits tp_size evenly), but this worker's devices split {list(devices_per_node)} over its "
                f"nodes; align device_mapping to the nodes' boundaries"
            )
        return None

    @field_validator("engine_kwargs")
    @classmethod
    def _check_engine_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        named = set(cls.model_fields) - {"engine_kwargs"}
        for key in value:
            if key in _RESERVED_ENGINE_KWARGS:
                raise ValueError(f"engine_kwargs.{key} is set by roll; use {_RESERVED_ENGINE_KWARGS[key]} instead")
            if key in named:
                raise ValueError(f"engine_kwargs.{key} duplicates strategy_config.{key}; set it there")
        return value

    def engine_args(self, model_args: Any, *, seed: int) -> dict[str, Any]:
        """Keyword arguments of ``sglang.Engine`` for this config and the role's ``ModelArgs``."""
        args: dict[str, Any] = {
            "model_path": model_args.model_name_or_path,
            "tokenizer_path": model_args.tokenizer_path,
            "trust_remote_code": model_args.trust_remote_code,
            "tp_size": self.tp_size,
            "base_gpu_id": 0,  # the runtime makes exactly this worker's GPUs visible
            "mem_fraction_static": self.mem_fraction_static,
            "dtype": self.dtype or model_args.dtype,
            "enable_memory_saver": self.enable_memory_saver,
            "disable_cuda_graph": self.disable_cuda_graph,
            "skip_tokenizer_init": self.skip_tokenizer_init,
            "log_level": self.log_level,
            "random_seed": seed,
        }
        optional = {
            "context_length": self.context_length,
            "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": self.chunked_prefill_size,
            "attention_backend": self.attention_backend,
            "load_format": self.load_format,
        }
        args.update({key: value for key, value in optional.items() if value is not None})
        if model_args.model_config_kwargs:
            args["json_model_override_args"] = json.dumps(model_args.model_config_kwargs)
        args.update(self.engine_kwargs)
        return args


# --- pure translations ----------------------------------------------------------------------------------------
def sampling_params(config: GenerationConfig, sample_index: int = 0) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one request (one sample).

    ``num_return_sequences`` is realized by :func:`sampling_requests` as separate requests, which fixes the row
    order; a configured seed is offset by the sample index so a prompt's samples differ.
    """
    params: dict[str, Any] = {
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,  # SGLang treats 0 as greedy
        "top_p": config.top_p,
        "top_k": config.top_k,
        "min_p": config.min_p,
        "repetition_penalty": config.repetition_penalty,
        "ignore_eos": config.ignore_eos,
        "n": 1,
    }
    if config.stop_strings:
        params["stop"] = list(config.stop_strings)
    if config.stop_token_ids:
        params["stop_token_ids"] = list(config.stop_token_ids)
    if config.seed is not None:
        params["sampling_seed"] = config.seed + sample_index
    return params


def sampling_requests(
    prompts: Sequence[Sequence[int]], config: GenerationConfig, seeds: Sequence[int] | None = None
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """``(input_ids, sampling_params)`` with ``num_return_sequences`` consecutive requests per prompt.

    ``seeds`` (one per sample, from :func:`~roll.strategies.generation.sample_seeds`) replace the configured seed:
    each request then samples from its own seed whatever else the engine runs with it.
    """
    n = config.num_return_sequences
    if seeds is not None and len(seeds) != len(prompts) * n:
        raise StrategyError(f"sampling_requests: {len(seeds)} seeds for {len(prompts) * n} samples")
    input_ids: list[list[int]] = []
    params: list[dict[str, Any]] = []
    for prompt_index, prompt in enumerate(prompts):
        for j in range(n):
            input_ids.append(list(prompt))
            params.append(sampling_params(config, prompt_index * n + j))
            if seeds is not None:
                params[-1]["sampling_seed"] = seeds[prompt_index * n + j]
    return input_ids, params


def parse_engine_output(output: Mapping[str, Any], *, with_logprobs: bool) -> tuple[list[int], list[float] | None, str]:
    """``(token ids, their log-probs or None, "stop" | "length")`` from one ``Engine.generate`` result."""
    meta = output.get("meta_info", {})
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, Mapping) else str(reason)
    if kind not in ("stop", "length"):
        raise StrategyError(f"sglang finished a request with {reason!r}; expected 'stop' or 'length'")
    entries = meta.get("output_token_logprobs")
    tokens = output.get("output_ids")
    if tokens is None:
        if entries is None:
            raise StrategyError("sglang returned neither output_ids nor output_token_logprobs for a request")
        tokens = [int(entry[1]) for entry in entries]
    tokens = [int(t) for t in tokens]
    if not with_logprobs:
        return tokens, None, kind
    if entries is None or len(entries) != len(tokens):
        raise StrategyError(
            f"sglang returned {0 if entries is None else len(entries)} log-probs for {len(tokens)} tokens; "
            "generate with return_logprob=True"
        )
    return tokens, [float(entry[0]) for entry in entries], kind


def memory_tags(include: Iterable[OffloadTarget] | None) -> list[str] | None:
    """SGLang memory-occupation tags for offload targets; None means everything. Optimizer states do not exist."""
    if include is None:
        return None
    targets = set(include)
    tags = []
    if OffloadTarget.MODEL_PARAMS in targets:
        tags.append("weights")
    if OffloadTarget.KV_CACHE in targets:
        tags.append("kv_cache")
    return tags


def check_engine_result(result: Any, action: str) -> None:
    """Raise StrategyError if an engine control call reports failure (``(success, message)`` or a dict)."""
    success, message = True, ""
    if isinstance(result, tuple) and result:
        success, message = bool(result[0]), str(result[1]) if len(result) > 1 else ""
    elif isinstance(result, Mapping):
        success, message = bool(result.get("success", True)), str(result.get("message", ""))
    elif isinstance(result, bool):
        success = result
    elif hasattr(result, "success"):
        success, message = bool(result.success), str(getattr(result, "message", ""))
    if not success:
        raise StrategyError(f"sglang {action} failed: {message or 'no message'}")
