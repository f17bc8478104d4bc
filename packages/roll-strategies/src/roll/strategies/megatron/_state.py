"""Weights and checkpoints of a megatron model: full HF tensors on rank 0, and resumable training state.

``iter_hf_weights`` gathers each parameter's TP shards (all-gather in the TP group) and brings it from the
pipeline stage that owns it (broadcast in the PP group) to global rank 0, one parameter at a time, so no rank
holds more than one full tensor. Only data-parallel replica 0 (context-parallel rank 0) takes part: rank 0's
TP and PP groups lie inside it. Checkpoints use ``megatron.core.dist_checkpointing`` (model + optimizer,
reshardable) plus one small torch file per rank with the LR scheduler, step and RNG states.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel

from roll.strategies.megatron._engine import local_parameters, unwrap
from roll.strategies.megatron._mapping import MegatronMapping
from roll.strategies.megatron._sharding import gather_tp

__all__ = ["iter_hf_weights", "load_training_state", "save_training_state"]

_DIST_DIR = "megatron"


def _full_shape(mapping: MegatronMapping, name: str, param: torch.Tensor, tp_size: int) -> tuple[int, ...]:
    shape = list(param.shape)
    dim = mapping.spec(name).tp_dim
    if dim is not None:
        shape[dim] *= tp_size
    return tuple(shape)


def iter_hf_weights(chunks: list[torch.nn.Module], mapping: MegatronMapping) -> Iterator[tuple[str, torch.Tensor]]:
    """Full tensors with HF names, yielded on global rank 0 (a collective over DP replica 0's ranks)."""
    if parallel_state.get_data_parallel_rank() != 0 or parallel_state.get_context_parallel_rank() != 0:
        return
    params = local_parameters(chunks)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    local_meta = {name: (_full_shape(mapping, name, p, tp_size), p.dtype) for name, p in params.items()}
    stage_meta: list[dict[str, Any]] = [local_meta]
    if pp_size > 1:
        stage_meta = [{} for _ in range(pp_size)]
        dist.all_gather_object(stage_meta, local_meta, group=pp_group)
    is_rank0 = dist.get_rank() == 0
    device = next(iter(params.values())).device
    for spec in mapping.specs:
        if not spec.exported:
            continue  # a tied output layer is the embedding
        owner = next((stage for stage, meta in enumerate(stage_meta) if spec.megatron_name in meta), None)
        if owner is None:
            continue
        full = _gather_param(params.get(spec.megatron_name), spec, tp_group, tp_size)
        if pp_size > 1:
            shape, dtype = stage_meta[owner][spec.megatron_name]
            if full is None:
                full = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(full, src=dist.get_global_rank(pp_group, owner), group=pp_group)
        if is_rank0:
            if full is None:
                raise RuntimeError(f"{spec.megatron_name}: rank 0 holds no gathered tensor to export")
            yield from mapping.to_hf(spec.megatron_name, full)


def _gather_param(param: torch.Tensor | None, spec: Any, tp_group: Any, tp_size: int) -> torch.Tensor | None:
    if param is None:
        return None
    data = param.data.contiguous()
    if spec.tp_dim is None or tp_size == 1:
        return data.clone()
    shards = [torch.empty_like(data) for _ in range(tp_size)]
    dist.all_gather(shards, data, group=tp_group)
    return gather_tp(spec, shards)


# --- checkpoints --------------------------------------------------------------------------------------------
def _sharded_state(chunks: list[torch.nn.Module], optimizer: Any, *, loading: bool) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for index, chunk in enumerate(chunks):
        state["model" if len(chunks) == 1 else f"model{index}"] = unwrap(chunk).sharded_state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=loading)
    return state


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def save_training_state(
    path: str, chunks: list[torch.nn.Module], optimizer: Any, scheduler: Any, extra: dict[str, Any]
) -> None:
    """Every rank: the sharded model/optimizer checkpoint, then this rank's scheduler/RNG/extra file."""
    directory = Path(path) / _DIST_DIR
    directory.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(chunks, optimizer, loading=False), str(directory))
    rank_state = {"rng": _rng_state(), "extra": extra}
    if scheduler is not None:
        rank_state["scheduler"] = scheduler.state_dict()
    torch.save(rank_state, Path(path) / f"rank_{dist.get_rank():05d}.pt")
    dist.barrier()


def load_training_state(path: str, chunks: list[torch.nn.Module], optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Restore what :func:`save_training_state` wrote; returns the ``extra`` dict saved by this rank."""
    state = dist_checkpointing.load(_sharded_state(chunks, optimizer, loading=True), str(Path(path) / _DIST_DIR))
    for index, chunk in enumerate(chunks):
        unwrap(chunk).load_state_dict(state["model" if len(chunks) == 1 else f"model{index}"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    rank_state = torch.load(Path(path) / f"rank_{dist.get_rank():05d}.pt", weights_only=False)
    if scheduler is not None and "scheduler" in rank_state:
        scheduler.load_state_dict(rank_state["scheduler"])
    _set_rng_state(rank_state["rng"])
    return rank_state.get("extra", {})
