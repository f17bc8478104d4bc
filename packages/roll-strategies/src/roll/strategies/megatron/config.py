"""Settings of the ``megatron_train`` / ``megatron_infer`` backends (pydantic only: no megatron import).

One worker is one process on one GPU; the workers of a role form one Megatron world of
``tensor x pipeline x context x data`` parallel ranks. The data-parallel size is derived:
``world_size / (tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size)``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from roll.runtime import ConfigError, RollModel

__all__ = ["MegatronConfig", "check_world_size"]


class MegatronConfig(RollModel):
    """Megatron-core parallelism, precision and memory settings."""

    tensor_model_parallel_size: int = Field(default=1, ge=1, description="Ranks each layer's matrices are split over.")
    pipeline_model_parallel_size: int = Field(default=1, ge=1, description="Pipeline stages (groups of layers).")
    virtual_pipeline_model_parallel_size: int | None = Field(
        default=None, ge=2, description="Model chunks per pipeline stage (interleaved schedule); needs pipeline > 1."
    )
    context_parallel_size: int = Field(
        default=1, ge=1, description="Ranks each sequence is split over; needs transformer_impl='transformer_engine'."
    )
    expert_model_parallel_size: int = Field(default=1, ge=1, description="Expert parallelism (MoE models only).")
    sequence_parallel: bool = Field(
        default=False, description="Shard activations along the sequence over TP ranks (transformer_engine only)."
    )
    use_distributed_optimizer: bool = Field(default=True, description="Shard optimizer states over data parallel.")
    overlap_grad_reduce: bool = Field(default=False, description="Overlap the gradient reduce with the backward.")
    grad_reduce_in_fp32: bool = Field(default=True, description="Accumulate and reduce gradients in float32.")
    recompute_granularity: Literal["full", "selective"] | None = Field(
        default=None, description="Activation recomputation: 'selective' (attention core) or 'full' (whole layers)."
    )
    recompute_method: Literal["uniform", "block"] | None = Field(default=None, description="Needed with 'full'.")
    recompute_num_layers: int | None = Field(default=None, ge=1, description="Needed with 'full'.")
    bf16: bool | None = Field(default=None, description="bf16 parameters/compute; None follows model_args.dtype.")
    fp16: bool | None = Field(default=None, description="fp16 with loss scaling; None follows model_args.dtype.")
    transformer_impl: Literal["local", "transformer_engine"] = Field(
        default="local", description="Layer spec: megatron-core's own modules, or Transformer Engine's fused ones."
    )
    make_vocab_size_divisible_by: int = Field(
        default=128, ge=1, description="Embedding rows are padded to a multiple of this times the TP size."
    )
    distributed_timeout_minutes: int = Field(default=30, ge=1)
    export_max_shard_size_mb: int = Field(default=5000, ge=1, description="safetensors shard size of export_hf.")

    @property
    def devices_per_worker(self) -> int:
        """One process per GPU: Megatron's ranks are the role's workers."""
        return 1

    @property
    def model_parallel_size(self) -> int:
        """Ranks one data-parallel replica spans (TP x PP x CP)."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

    @model_validator(mode="after")
    def _check_combinations(self) -> MegatronConfig:
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError(
                "sequence_parallel=true needs tensor_model_parallel_size > 1 (it shards activations over TP ranks); "
                "set sequence_parallel=false or raise tensor_model_parallel_size"
            )
        if self.sequence_parallel and self.transformer_impl != "transformer_engine":
            raise ValueError(
                "sequence_parallel=true needs transformer_impl='transformer_engine' (megatron-core's local RMSNorm "
                "cannot shard the sequence); change transformer_impl or set sequence_parallel=false"
            )
        if self.virtual_pipeline_model_parallel_size is not None and self.pipeline_model_parallel_size == 1:
            raise ValueError(
                "virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1; remove it or raise "
                "pipeline_model_parallel_size"
            )
        if self.context_parallel_size > 1 and self.transformer_impl != "transformer_engine":
            raise ValueError(
                "context_parallel_size > 1 needs transformer_impl='transformer_engine' (megatron-core's local "
                "attention cannot split sequences); change transformer_impl or set context_parallel_size=1"
            )
        if self.bf16 and self.fp16:
            raise ValueError("bf16 and fp16 are both true; choose one (or leave both unset to follow model_args.dtype)")
        self._check_recompute()
        return self

    def _check_recompute(self) -> None:
        full = self.recompute_granularity == "full"
        if full and (self.recompute_method is None or self.recompute_num_layers is None):
            raise ValueError(
                "recompute_granularity='full' needs recompute_method ('uniform' or 'block') and recompute_num_layers"
            )
        if not full and (self.recompute_method is not None or self.recompute_num_layers is not None):
            raise ValueError(
                "recompute_method/recompute_num_layers apply only to recompute_granularity='full'; remove them"
            )


def check_world_size(config: MegatronConfig, world_size: int) -> int:
    """The data-parallel size of ``world_size`` ranks; raises ConfigError naming the fields that do not divide it."""
    tp, pp, cp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size
    if world_size % config.model_parallel_size:
        raise ConfigError(
            f"megatron world size {world_size} (the role's workers) is not divisible by tensor_model_parallel_size "
            f"({tp}) x pipeline_model_parallel_size ({pp}) x context_parallel_size ({cp}) = "
            f"{config.model_parallel_size}; change device_mapping or these sizes"
        )
    data_parallel = world_size // config.model_parallel_size
    ep = config.expert_model_parallel_size
    if (data_parallel * cp) % ep:
        raise ConfigError(
            f"expert_model_parallel_size ({ep}) must divide data-parallel size ({data_parallel}) x "
            f"context_parallel_size ({cp}) = {data_parallel * cp}; change expert_model_parallel_size or device_mapping"
        )
    return data_parallel
