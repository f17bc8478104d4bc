"""Megatron-core plumbing: process groups, model chunks, HF weight loading, optimizer, offloading.

This module (with ``_state`` and ``strategy``) imports megatron at import time; everything that can be tested
without megatron lives in the pure helpers (``_mapping``, ``_sharding``, ``_translate``, ``_batching``).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig

from roll.strategies.config import TrainingArgs
from roll.strategies.contract import StrategyError
from roll.strategies.megatron._hf_io import HfCheckpointReader
from roll.strategies.megatron._mapping import GptLayout, MegatronMapping, to_global_name
from roll.strategies.megatron._sharding import shard_tp
from roll.strategies.megatron._translate import (
    gpt_model_kwargs,
    optimizer_config_kwargs,
    scheduler_kwargs,
    transformer_config_kwargs,
)
from roll.strategies.megatron.config import MegatronConfig, check_world_size

__all__ = [
    "build_model_chunks",
    "build_optimizer",
    "copy_full_tensors",
    "init_parallel",
    "load_hf_weights",
    "local_parameters",
    "move_model",
    "unwrap",
    "wrap_ddp",
]

logger = logging.getLogger(__name__)


def init_parallel(config: MegatronConfig, rank: int, world_size: int, local_rank: int, seed: int) -> torch.device:
    """torch.distributed (NCCL on GPUs) and megatron's parallel groups; returns this rank's device."""
    check_world_size(config, world_size)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(minutes=config.distributed_timeout_minutes)
        if world_size == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    elif dist.get_world_size() != world_size:
        raise StrategyError(
            f"torch.distributed already has {dist.get_world_size()} ranks in this process but the role has "
            f"{world_size} workers; run one megatron role per process"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=config.tensor_model_parallel_size,
            pipeline_model_parallel_size=config.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=config.virtual_pipeline_model_parallel_size,
            context_parallel_size=config.context_parallel_size,
            expert_model_parallel_size=config.expert_model_parallel_size,
            distributed_timeout_minutes=config.distributed_timeout_minutes,
        )
    _seed_everything(seed)
    return device


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        # Seeds the model-parallel RNG tracker: TP ranks draw different dropout masks, DP replicas the same ones.
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def unwrap(chunk: torch.nn.Module) -> GPTModel:
    """The GPTModel inside DDP / Float16Module wrappers."""
    inner: Any = chunk
    while not isinstance(inner, GPTModel):
        inner = inner.module
    return inner


def _layer_spec(config: MegatronConfig, layout: GptLayout) -> Any:
    if config.transformer_impl == "transformer_engine":
        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=layout.qk_layernorm)
    return get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=layout.qk_layernorm)


def build_model_chunks(
    config: MegatronConfig, layout: GptLayout, hf_config: Any, params_dtype: torch.dtype, device: torch.device
) -> list[torch.nn.Module]:
    """This pipeline rank's model chunks (one, or one per virtual stage), in params_dtype on ``device``."""
    kwargs = transformer_config_kwargs(layout, hf_config, config, params_dtype)
    # Without a GPU (unit checks only) megatron must allocate parameters on the CPU.
    kwargs["use_cpu_initialization"] = device.type != "cuda"
    transformer_config = TransformerConfig(**kwargs)
    spec = _layer_spec(config, layout)
    vpp = config.virtual_pipeline_model_parallel_size
    chunks: list[torch.nn.Module] = []
    for index in range(vpp or 1):
        vp_stage = index if vpp else None
        model = GPTModel(
            config=transformer_config,
            transformer_layer_spec=spec,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            vp_stage=vp_stage,
            **gpt_model_kwargs(layout, hf_config),
        )
        model.to(device)
        if transformer_config.fp16 or transformer_config.bf16:
            # Runs the chunk in half precision and hands float32 logits to the loss on the last stage.
            model = Float16Module(transformer_config, model)
        chunks.append(model)
    return chunks


def layer_numbers(model: GPTModel) -> list[int]:
    """Global (0-based) index of each of the chunk's decoder layers."""
    return [layer.layer_number - 1 for layer in model.decoder.layers]


def local_parameters(chunks: Iterable[torch.nn.Module]) -> dict[str, torch.nn.Parameter]:
    """This rank's parameters under their global megatron names (all chunks)."""
    params: dict[str, torch.nn.Parameter] = {}
    for chunk in chunks:
        model = unwrap(chunk)
        numbers = layer_numbers(model)
        for name, param in model.named_parameters():
            params[to_global_name(name, numbers)] = param
    return params


def copy_full_tensors(
    params: dict[str, torch.nn.Parameter],
    mapping: MegatronMapping,
    named_full: Iterable[tuple[str, torch.Tensor]],
    tp_rank: int,
    tp_size: int,
) -> int:
    """Copy this TP rank's shard of each full megatron tensor into the local parameter; returns the count."""
    copied = 0
    with torch.no_grad():
        for name, full in named_full:
            param = params.get(name)
            if param is None:
                continue  # another pipeline stage holds it
            shard = shard_tp(mapping.spec(name), full, tp_rank, tp_size)
            if tuple(shard.shape) != tuple(param.shape):
                raise StrategyError(
                    f"{name}: the checkpoint gives shape {tuple(shard.shape)} for this rank, the model has "
                    f"{tuple(param.shape)}; does the checkpoint match model_args.model_name_or_path?"
                )
            param.data.copy_(shard, non_blocking=True)
            copied += 1
    return copied


def load_hf_weights(chunks: list[torch.nn.Module], mapping: MegatronMapping, model_path: str) -> None:
    """Fill every local parameter from the HF folder (each rank reads only what its shard needs)."""
    params = local_parameters(chunks)
    unknown = [name for name in params if name not in mapping]
    if unknown:
        raise StrategyError(f"megatron parameters the HF mapping does not know: {unknown[:5]}")
    reader = HfCheckpointReader(model_path)
    try:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
        named = ((name, mapping.to_megatron(name, reader.get)) for name in params)
        copy_full_tensors(params, mapping, named, tp_rank, tp_size)
    finally:
        reader.close()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wrap_ddp(chunks: list[torch.nn.Module], config: MegatronConfig) -> list[torch.nn.Module]:
    """Megatron's DDP around each chunk (gradient buffers, bucketed reduce / distributed-optimizer sharding)."""
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=config.grad_reduce_in_fp32,
        overlap_grad_reduce=config.overlap_grad_reduce,
        use_distributed_optimizer=config.use_distributed_optimizer,
    )
    wrapped = []
    for index, chunk in enumerate(chunks):
        transformer_config = unwrap(chunk).config
        # Only the first chunk gets buckets (megatron's convention for interleaved pipelines).
        wrapped.append(DistributedDataParallel(transformer_config, ddp_config, chunk, disable_bucketing=index > 0))
    return wrapped


def build_optimizer(chunks: list[torch.nn.Module], args: TrainingArgs, config: MegatronConfig, params_dtype):
    """Megatron's optimizer (fp32 master weights, model-parallel grad-norm clipping) and its LR scheduler."""
    optimizer = get_megatron_optimizer(OptimizerConfig(**optimizer_config_kwargs(args, config, params_dtype)), chunks)
    scheduler = OptimizerParamScheduler(optimizer, **scheduler_kwargs(args))
    model_config = unwrap(chunks[0]).config
    model_config.grad_scale_func = optimizer.scale_loss
    model_config.finalize_model_grads_func = finalize_model_grads
    if config.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in chunks]
        model_config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return optimizer, scheduler


def move_model(chunks: list[torch.nn.Module], device: torch.device, *, grads: bool) -> None:
    """Move parameters (and, for DDP chunks, gradient buffers if ``grads``) to ``device``.

    Parameters that live in a DDP parameter buffer (distributed optimizer) move with the buffer so their views
    stay valid; other parameters move one by one.
    """
    to_cpu = device.type == "cpu"
    for chunk in chunks:
        buffered: set[int] = set()
        buffers = list(getattr(chunk, "buffers", [])) + list(getattr(chunk, "expert_parallel_buffers", []))
        for buffer in buffers:
            if buffer.param_data is None:
                continue
            if to_cpu:
                buffer.offload_to_cpu(move_params=True, move_grads=False)
            else:
                buffer.reload_from_cpu(move_params=True, move_grads=False)
            buffered.update(id(p) for p in buffer.params)
        for param in unwrap(chunk).parameters():
            if id(param) not in buffered:
                param.data = param.data.to(device, non_blocking=True)
        if grads and isinstance(chunk, DistributedDataParallel) and torch.cuda.is_available():
            chunk.offload_grad_buffers() if to_cpu else chunk.restore_grad_buffers()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        if to_cpu:
            torch.cuda.empty_cache()
