"""Resumable checkpoints (sharded model + optimizer via torch.distributed.checkpoint) and HF exports.

Layout of a checkpoint folder::

    model_optim/        DCP shards of the model and optimizer states (every rank writes its own)
    scheduler.pt        LR scheduler state (rank 0)
    rng/rank_{r}.pt     python, numpy, torch and CUDA generator states of rank r
    roll_fsdp2.json     topology and LoRA settings, checked on load
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from roll.strategies.contract import StrategyError

logger = logging.getLogger(__name__)

__all__ = ["export_hf_folder", "load_training_state", "save_training_state"]

_META = "roll_fsdp2.json"


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_training_state(
    path: str, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, meta: dict[str, Any]
) -> None:
    """Write a checkpoint under ``path``; every rank calls this (the folder must be shared by all ranks)."""
    root = Path(path)
    rank = dist.get_rank()
    if rank == 0:
        (root / "rng").mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(root / "model_optim"))
    torch.save(_rng_state(), root / "rng" / f"rank_{rank}.pt")
    if rank == 0:
        torch.save(scheduler.state_dict(), root / "scheduler.pt")
        (root / _META).write_text(json.dumps(meta, indent=1, sort_keys=True))
    dist.barrier()
    logger.info("saved checkpoint to %s", root)


def load_training_state(
    path: str, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, meta: dict[str, Any]
) -> None:
    """Restore what :func:`save_training_state` wrote; ``meta`` must match what was saved (except world size)."""
    root = Path(path)
    meta_file = root / _META
    if not meta_file.exists():
        raise StrategyError(f"{root} is not an fsdp2 checkpoint (no {_META}); pass the folder save_checkpoint wrote")
    saved = json.loads(meta_file.read_text())
    if saved.get("lora_rank") != meta.get("lora_rank"):
        raise StrategyError(
            f"checkpoint {root} was written with lora_rank={saved.get('lora_rank')}, this model has "
            f"lora_rank={meta.get('lora_rank')}; use the same model_args as when it was saved"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(root / "model_optim"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(torch.load(root / "scheduler.pt", weights_only=False))
    rng_file = root / "rng" / f"rank_{dist.get_rank()}.pt"
    if rng_file.exists():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        logger.warning(
            "%s has no RNG state for rank %d (different world size?); keeping the current one", root, dist.get_rank()
        )
    dist.barrier()
    logger.info("loaded checkpoint from %s", root)


def export_hf_folder(
    path: str,
    named_weights: Iterable[tuple[str, torch.Tensor]],
    hf_config: Any,
    *,
    dtype: torch.dtype,
    tokenizer: Any,
    generation_config: Any,
    max_shard_size: str,
) -> None:
    """Write an HF model folder on rank 0 (safetensors + config + tokenizer); every rank must call this."""
    from huggingface_hub import save_torch_state_dict

    rank = dist.get_rank()
    state: dict[str, torch.Tensor] = {}
    for name, tensor in named_weights:  # a collective: all ranks walk the weights together
        if rank == 0:
            state[name] = tensor.detach().to("cpu", copy=True).contiguous()
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        config = copy.deepcopy(hf_config)
        config.dtype = dtype
        config.use_cache = True
        if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" in state:
            # Tied in the config: transformers re-ties it on load, and a second copy would only waste space.
            del state["lm_head.weight"]
        config.save_pretrained(path)
        if generation_config is not None:
            generation_config.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        save_torch_state_dict(state, path, max_shard_size=max_shard_size)
        logger.info("exported an HF model (%d tensors) to %s", len(state), path)
    dist.barrier()
