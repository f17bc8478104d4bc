"""Settings of the FSDP2 backends (``fsdp2_train``, ``fsdp2_infer``): pydantic only, no torch import."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from roll.runtime import RollModel

__all__ = ["Fsdp2Config"]

Dtype = Literal["float32", "bfloat16", "float16"]


class Fsdp2Config(RollModel):
    """How a role shards its model with ``torch.distributed.fsdp.fully_shard``.

    Every worker owns one device. With ``fsdp_size`` smaller than the role's world size the ranks form a 2-D
    (replicate x shard) mesh (HSDP): parameters are sharded over ``fsdp_size`` ranks and replicated across groups.
    """

    mid_run_learning_rate: ClassVar[bool] = True  # fsdp2_train implements TrainStrategy.set_learning_rate

    fsdp_size: int | None = Field(
        default=None, ge=1, description="Ranks one parameter is sharded over; None = the whole world (plain FSDP)."
    )
    reshard_after_forward: bool = Field(
        default=True, description="Free gathered layer weights after forward (less memory, one more all-gather)."
    )
    param_dtype: Dtype | None = Field(
        default=None,
        description="Compute dtype. None: model_args.dtype on CUDA, float32 on CPU. Training keeps float32 masters.",
    )
    reduce_dtype: Dtype | None = Field(default=None, description="Gradient reduction dtype; None = float32.")
    backend: str | None = Field(
        default=None,
        description="torch.distributed backend; None = 'cpu:gloo,cuda:nccl' on CUDA, 'gloo' on CPU.",
    )
    wrap_modules: list[str] | None = Field(
        default=None,
        description="Class names sharded as separate units; None = the model's _no_split_modules (decoder layers).",
    )
    wrap_blocks: bool = Field(
        default=True,
        description="Shard each block (wrap_modules, decoder layers, diffusion blocks) as its own FSDP unit. False: "
        "the whole model is one unit (all weights gathered at once: more memory); on one rank its gradients are "
        "then bit for bit the unwrapped model's (per-block units change the order autograd sums them in).",
    )
    ulysses_size: int = Field(
        default=1,
        ge=1,
        description="Ulysses sequence parallelism: ranks that share one data-parallel rank, each running a slice of "
        "every sequence (attention heads split over them); must divide the world size and the attention heads. "
        "ROLL: model_args.ulysses_size.",
    )
    process_group_timeout_s: float = Field(default=1800.0, gt=0, description="Timeout of collective operations.")
    export_max_shard_size: str = Field(default="5GB", description="Largest safetensors file export_hf writes.")

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("backend must be a torch.distributed backend such as 'gloo' or 'nccl', or null")
        return value

    @field_validator("wrap_modules")
    @classmethod
    def _check_wrap_modules(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("wrap_modules is empty: list decoder layer class names, or null to use the model's")
        return value

    @property
    def devices_per_worker(self) -> int:
        return 1
