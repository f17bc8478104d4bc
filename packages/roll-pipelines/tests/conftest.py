"""Hooks for all of roll-pipelines's tests: roll's markers (gpu tests skip without CUDA)."""

from __future__ import annotations

from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)
