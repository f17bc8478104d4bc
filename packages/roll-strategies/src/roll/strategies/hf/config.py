"""Settings of the hf_infer backend (pydantic only: validating a config never imports torch or transformers)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.runtime import RollModel

__all__ = ["HfInferConfig"]


class HfInferConfig(RollModel):
    """How hf_infer places the model and batches generation; the model itself comes from ``model_args``."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="'auto' uses cuda:0 (the runtime sets CUDA_VISIBLE_DEVICES per worker) when CUDA is available, "
        "else the CPU.",
    )
    generate_batch_size: int = Field(
        default=16,
        ge=1,
        description="Most prompts per transformers generate() call; each brings num_return_sequences rows.",
    )
    cpu_bfloat16: bool | None = Field(
        default=None,
        description="Keep model_args.dtype=bfloat16 on the CPU. None: only when the CPU has native bf16 support; "
        "otherwise float32 is used (float16 always becomes float32 on the CPU).",
    )

    share_weights_on_node: bool = Field(
        default=True,
        description="On the CPU: engines of this role on one node keep one copy of the weights in shared memory "
        "(/dev/shm); one of them loads each weight sync and the others wait for it, instead of every engine copying "
        "every byte. Models with persistent buffers keep their own copies.",
    )

    @property
    def devices_per_worker(self) -> int:
        return 1
