"""A tiny tokenizer (with the ChatML template) for the evaluation tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from roll.strategies.testing import make_tiny_causal_lm

    path: Path = make_tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"), preset="nano")
    return AutoTokenizer.from_pretrained(path)
