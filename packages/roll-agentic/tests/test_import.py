"""roll-agentic is a skeleton until its issue lands: it imports and sits on top of roll.pipelines."""

from __future__ import annotations

import importlib


def test_package_imports():
    module = importlib.import_module("roll.agentic")
    assert module.__all__ == []
