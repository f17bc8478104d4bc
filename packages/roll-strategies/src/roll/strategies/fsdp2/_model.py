"""Process group, device mesh, model loading (optionally with LoRA) and FSDP2 sharding."""

from __future__ import annotations

import logging
import os
import random
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from roll.runtime import ConfigError, import_extra
from roll.strategies.contract import StrategyError
from roll.strategies.hf._loading import pretrained_kwargs
from roll.strategies.ulysses import (
    UlyssesGroup,
    activate,
    check_heads,
    gather_sequence,
    new_ulysses_group,
    register_ulysses_attention,
    shard_sequence,
)

if TYPE_CHECKING:
    from roll.strategies.config import ModelArgs
    from roll.strategies.fsdp2.config import Fsdp2Config

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(local_rank: int) -> torch.device:
    """The worker's accelerator (the runtime makes exactly its own devices visible), or the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_process_group(config: Fsdp2Config, device: torch.device, rank: int, world_size: int) -> None:
    """Create the default process group from the runtime's env (RANK, WORLD_SIZE, MASTER_ADDR/PORT) once."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise StrategyError(
                f"a torch.distributed group of {dist.get_world_size()} ranks already exists in this process, but the "
                f"worker has world_size={world_size}; run one FSDP2 role per process"
            )
        return
    backend = config.backend or ("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    timeout = timedelta(seconds=config.process_group_timeout_s)
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        # A single in-process worker (tests, notebooks) needs no rendezvous port.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    logger.info("initialized torch.distributed (%s) rank %d/%d", backend, rank, world_size)


def build_mesh(config: Fsdp2Config, device: torch.device, world_size: int) -> DeviceMesh:
    """1-D shard mesh, or a 2-D (replicate, shard) mesh for HSDP when ``fsdp_size`` < world size."""
    fsdp_size = config.fsdp_size or world_size
    if fsdp_size > world_size or world_size % fsdp_size:
        raise StrategyError(
            f"strategy_config.fsdp_size={fsdp_size} must divide the role's world size {world_size}; "
            f"choose a divisor of {world_size} or null"
        )
    if fsdp_size == world_size:
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def build_ulysses_group(config: Fsdp2Config, model_args: ModelArgs, rank: int, world_size: int) -> UlyssesGroup | None:
    """This rank's Ulysses sequence-parallel group (None when ``ulysses_size`` is 1); a collective on every rank."""
    size = config.ulysses_size
    if size == 1:
        activate(None)
        return None
    if model_args.model_kind == "diffusion":
        raise StrategyError(
            f"strategy_config.ulysses_size={size} splits token sequences; diffusion models have none, set it to 1"
        )
    group = new_ulysses_group(size, rank, world_size)
    activate(group)
    return group


def use_ulysses_attention(model: nn.Module, group: UlyssesGroup) -> None:
    """Check the heads split over the group and switch the model's attention to the Ulysses exchange."""
    base = hf_model(model)
    if getattr(base.config, "vision_config", None) is not None:
        raise StrategyError(
            f"strategy_config.ulysses_size={group.size}: Ulysses sequence parallelism of vision-language models "
            f"({type(base).__name__}) is not implemented (image tokens would be split from their pixels); set it to 1"
        )
    text_config = getattr(base.config, "get_text_config", lambda: base.config)()
    check_heads(text_config, group.size)
    base.set_attn_implementation(register_ulysses_attention())  # type: ignore[operator]


def ulysses_logits(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    group: UlyssesGroup,
    pad_token_id: int,
    keep: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """float32 logits from this rank's slice of the sequence, gathered on every rank of the group: of the whole
    sequence (b, T, V), or with ``keep`` (the model's ``logits_to_keep``) of the kept positions only, as the model
    would return them without Ulysses (each rank's head runs on its share of them)."""
    shard = shard_sequence(inputs, group, pad_token_id, keep)
    extra = {} if shard.keep is None else {"logits_to_keep": shard.keep}
    logits = gather_sequence(model(**shard.inputs, **extra, use_cache=False).logits, group, shard.counts)
    return (logits if shard.keep is not None else logits[:, : shard.length]).float()


def set_seed(seed: int) -> None:
    """Seed every generator so all ranks build identical LoRA adapters and draw identical dropout masks."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_dtypes(config: Fsdp2Config, model_args: ModelArgs, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """(compute dtype, gradient reduction dtype). CPUs compute in float32 unless param_dtype asks otherwise."""
    default = model_args.dtype if device.type == "cuda" else "float32"
    return DTYPES[config.param_dtype or default], DTYPES[config.reduce_dtype or "float32"]


def load_tokenizer(model_args: ModelArgs) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_args.tokenizer_path, trust_remote_code=model_args.trust_remote_code)


def load_model(model_args: ModelArgs, dtype: torch.dtype, *, train: bool) -> nn.Module:
    """The HF causal LM (or value model) on the CPU in ``dtype`` (fully_shard moves it to the device shard by shard).

    ``model_args.model_head == "value"`` loads the same backbone with a one-output token-classification head
    (the PPO critic); its "logits" are then (b, T, 1) values.
    """
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    if not model_args.model_name_or_path:
        raise ConfigError("model_args.model_name_or_path is not set; point it at a local HF model folder")
    if model_args.model_head == "value":
        kwargs = pretrained_kwargs(model_args, dtype, num_labels=1)
        model = AutoModelForTokenClassification.from_pretrained(model_args.model_name_or_path, **kwargs)
    else:
        kwargs = pretrained_kwargs(model_args, dtype)
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    model.config.use_cache = False
    if train and model_args.gradient_checkpointing:
        # Non-reentrant checkpointing works with frozen inputs (LoRA) and with FSDP2's hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not train:
        model.requires_grad_(False)
    return model


def apply_lora(model: nn.Module, model_args: ModelArgs) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (peft); the adapters train, and so do ``lora_modules_to_save`` and a value
    head's ``score`` (trained in place under their own names, without adapters), the rest stays frozen."""
    peft = import_extra("peft", "LoRA training with fsdp2_train", "roll-strategies", "fsdp2")
    value_head = model_args.model_head == "value"
    full = [*(model_args.lora_modules_to_save or []), *(["score"] if value_head else [])]
    lora = peft.LoraConfig(
        r=model_args.lora_rank,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        exclude_modules=full or None,
        # a value model is no causal LM (peft's causal-LM wrapper needs generation methods it lacks)
        task_type=None if value_head else "CAUSAL_LM",
    )
    with warnings.catch_warnings():  # a module trained in full that no adapter would target anyway is no mistake
        warnings.filterwarnings("ignore", message="You have passed exclude_modules")
        wrapped = peft.get_peft_model(model, lora)
    base = hf_model(wrapped)
    for name in full:
        modules = [m for path, m in base.named_modules() if path == name or path.endswith(f".{name}")]
        if not modules:
            raise ConfigError(
                f"model_args.lora_modules_to_save names {name!r}, which is no module of {type(base).__name__}; "
                "give a module name or its last part, e.g. embed_tokens or lm_head"
            )
        for module in modules:
            module.requires_grad_(True)
    return wrapped


def hf_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a (possibly peft-wrapped) module."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    config: Fsdp2Config,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
) -> nn.Module:
    """``fully_shard`` each decoder layer (unless ``config.wrap_blocks`` is off), then the root (embeddings, final
    norm, LM head)."""
    base = hf_model(model)
    names = set(config.wrap_modules or getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in base.modules() if type(m).__name__ in names] if config.wrap_blocks else []
    if not layers and config.wrap_blocks:
        raise StrategyError(
            f"no module of {type(base).__name__} is a {sorted(names) or 'decoder layer class'}; set "
            "strategy_config.wrap_modules to the class names of its decoder layers"
        )
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=config.reshard_after_forward, mp_policy=mp_policy)
    # None lets FSDP keep the root gathered between forward and backward (it is needed again at once).
    fully_shard(
        model, mesh=mesh, reshard_after_forward=None if config.reshard_after_forward else False, mp_policy=mp_policy
    )
    return model


def reshard(model: nn.Module) -> None:
    """Return every FSDP unit to its sharded state (so parameters are DTensors again)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
