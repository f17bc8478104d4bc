"""Loading a role's tokenizer on the driver (for data encoding and decoding)."""

from __future__ import annotations

from typing import Any

from roll.runtime import ConfigError
from roll.strategies import ModelArgs

__all__ = ["load_tokenizer"]


def load_tokenizer(model_args: ModelArgs) -> Any:
    from transformers import AutoTokenizer

    path = model_args.tokenizer_path
    if not path:
        raise ConfigError("model_args.model_name_or_path (or tokenizer_name_or_path) is required to load a tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
