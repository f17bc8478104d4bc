"""Loading an HF folder for hf_infer: device and dtype choice, tokenizer with a pad token, model."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from roll.runtime import ConfigError
from roll.strategies.config import ModelArgs
from roll.strategies.hf.config import HfInferConfig
from roll.strategies.registry import check_attention_installed

__all__ = [
    "choose_device",
    "choose_dtype",
    "load_model",
    "load_tokenizer",
    "pretrained_kwargs",
    "require_folder",
    "stop_token_ids_of",
]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def require_folder(path: str | None, field: str) -> str:
    """``path`` if it is an existing folder; else a ConfigError naming ``field`` (hf_infer never downloads)."""
    if not path:
        raise ConfigError(f"{field} is not set: hf_infer needs a local folder with an HF model (config.json, weights)")
    if not os.path.isdir(path):
        raise ConfigError(
            f"{field}={path!r} is not a folder: hf_infer loads local HF folders only; download the model first "
            "(e.g. `huggingface-cli download <id> --local-dir <folder>`) and point the field at it"
        )
    return path


def choose_device(config: HfInferConfig) -> torch.device:
    """cuda:0 (the runtime gives each worker its own CUDA_VISIBLE_DEVICES) when asked for or available, else CPU."""
    has_cuda = torch.cuda.is_available()
    if config.device == "cuda" and not has_cuda:
        raise ConfigError("strategy_config.device='cuda' but CUDA is not available here; use 'auto' or 'cpu'")
    if config.device == "cuda" or (config.device == "auto" and has_cuda):
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def choose_dtype(model_args: ModelArgs, config: HfInferConfig, device: torch.device) -> torch.dtype:
    """``model_args.dtype``, except on a CPU: float16 -> float32, bfloat16 -> float32 without native bf16."""
    dtype = _DTYPES[model_args.dtype]
    if device.type != "cpu" or dtype == torch.float32:
        return dtype
    keep_bf16 = config.cpu_bfloat16 if config.cpu_bfloat16 is not None else _cpu_has_bf16()
    if dtype == torch.bfloat16 and keep_bf16:
        return dtype
    # CPU half precision without hardware support is slow and loses accuracy for no memory win worth having.
    logger.info("hf_infer: model_args.dtype=%s on a CPU without native support; loading float32", model_args.dtype)
    return torch.float32


def load_tokenizer(model_args: ModelArgs) -> Any:
    """The tokenizer, left-padding, with a pad token (the EOS token when the tokenizer has none)."""
    from transformers import AutoTokenizer

    field = (
        "model_args.tokenizer_name_or_path" if model_args.tokenizer_name_or_path else "model_args.model_name_or_path"
    )
    path = require_folder(model_args.tokenizer_path, field)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ConfigError(
                f"the tokenizer in {path} has neither a pad nor an EOS token; add a pad token to its "
                "tokenizer_config.json (hf_infer needs one to batch prompts)"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pretrained_kwargs(model_args: ModelArgs, dtype: torch.dtype, **config_overrides: Any) -> dict[str, Any]:
    """The arguments of transformers' ``from_pretrained`` for ``model_args`` (hf_infer's and fsdp2's loaders); an
    ``attn_implementation`` whose kernel package is missing is a ConfigError naming it, before anything loads.

    ``model_args.model_config_kwargs`` and ``config_overrides`` (the loader's own, e.g. a value head's
    ``num_labels``) are set on the model's config, loaded here, as ROLL's loaders do."""
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": model_args.trust_remote_code}
    overrides = {**model_args.model_config_kwargs, **config_overrides}
    if overrides:
        from transformers import AutoConfig

        path = model_args.model_name_or_path
        if not path:
            raise ConfigError("model_args.model_name_or_path is not set; point it at a local HF model folder")
        kwargs["config"] = AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code, **overrides)
    if model_args.attn_implementation:
        check_attention_installed(model_args.attn_implementation)
        kwargs["attn_implementation"] = model_args.attn_implementation
    return kwargs


def load_model(model_args: ModelArgs, dtype: torch.dtype, device: torch.device) -> Any:
    """The causal LM in eval mode on ``device``, without gradients (hf_infer never trains)."""
    from transformers import AutoModelForCausalLM

    path = require_folder(model_args.model_name_or_path, "model_args.model_name_or_path")
    model = AutoModelForCausalLM.from_pretrained(path, **pretrained_kwargs(model_args, dtype))
    torch.nn.Module.to(model, device)
    model.eval()
    model.requires_grad_(False)
    return model


def stop_token_ids_of(tokenizer: Any, model: Any) -> list[int]:
    """EOS ids of the tokenizer and of the model's generation_config (chat models often list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list | tuple):
        ids.update(int(i) for i in configured)
    return sorted(ids)
