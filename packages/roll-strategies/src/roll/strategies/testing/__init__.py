"""Test and recipe helpers: tiny local models and tokenizers (no model hub needed)."""

from __future__ import annotations

from roll.strategies.testing._tiny import (
    TINY_PRESETS,
    default_corpus,
    make_tiny_causal_lm,
    make_tokenizer,
    spread_weights,
)

__all__ = ["TINY_PRESETS", "default_corpus", "make_tiny_causal_lm", "make_tokenizer", "spread_weights"]
