"""Shared fixtures for the data tests: one tiny Qwen2 model + tokenizer per session, and a jsonl writer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from roll.strategies.testing import make_tiny_causal_lm

    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny_lm"), preset="nano")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Write rows (dicts, or raw strings written as-is) one per line to ``tmp_path/name``."""

    def write(name: str, rows: list[Any]) -> Path:
        path = tmp_path / name
        lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write
