"""Hooks and fixtures for all of roll-pipelines's tests: roll's markers (gpu tests skip without CUDA), a local hub
cache."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)

HubCache = Callable[..., Path]


def _lay_out_snapshot(cache: Path, repo_id: str, folder: Path, *, repo_type: str, ref: str) -> Path:
    """Put ``folder``'s files into ``cache`` as huggingface_hub lays out a downloaded snapshot: content-addressed
    blobs, a snapshot folder of symlinks named by a commit hash, and ``refs/<ref>`` holding that hash."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    commit = hashlib.sha1(b"".join(p.read_bytes() for p in files) + ref.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for path in files:
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HubCache:
    """An empty Hugging Face hub cache in offline mode (HF_HUB_CACHE, HF_HUB_OFFLINE=1; USE_MODELSCOPE unset).

    ``hub_cache(repo_id, folder, repo_type="model", ref="main")`` adds ``folder`` to it as ``repo_id``'s snapshot at
    ``ref`` and returns the snapshot folder.
    """
    cache = tmp_path / "hf-hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("USE_MODELSCOPE", raising=False)

    def add(repo_id: str, folder: Path, *, repo_type: str = "model", ref: str = "main") -> Path:
        return _lay_out_snapshot(cache, repo_id, folder, repo_type=repo_type, ref=ref)

    add.cache = cache  # type: ignore[attr-defined]
    return add
