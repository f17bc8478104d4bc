"""Hub references: model ids and dataset names resolved to local folders through the Hugging Face or ModelScope cache.

A model reference that is not a local path and looks like a hub id (``Qwen/Qwen2.5-0.5B-Instruct``) is downloaded
once with ``huggingface_hub.snapshot_download`` into the HF cache (``$HF_HUB_CACHE``, default
``~/.cache/huggingface/hub``) and read from there afterwards. ``model_args.revision`` picks a branch, tag or commit.
With ``HF_HUB_OFFLINE=1`` only the cache is read, and a reference missing from it is one error naming the id, the
revision and the cache folder. With ``USE_MODELSCOPE=1`` (as in ROLL) ids are resolved on ModelScope instead, through
``modelscope.snapshot_download`` (the ``modelscope`` extra).

Environment variables are read when a reference is resolved, not when this module is imported.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from roll.runtime import ConfigError, import_extra

__all__ = [
    "HubError",
    "cached_hub_repo",
    "hf_cache_dir",
    "hub_offline",
    "is_hub_id",
    "resolve_hub_repo",
    "use_modelscope",
]

# "name" or "namespace/name": letters, digits, '-', '_', '.'; no leading '.', no '..' (as the HF hub allows).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_TRUE = {"1", "true", "yes", "on"}


class HubError(ConfigError):
    """A hub reference could not be resolved (not in the cache while offline, unknown id or revision, no network)."""


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def use_modelscope() -> bool:
    """Whether hub ids go to ModelScope (``USE_MODELSCOPE`` set to 1/true, as in ROLL)."""
    return _flag("USE_MODELSCOPE")


def hub_offline() -> bool:
    """Whether the HF hub may not be contacted (``HF_HUB_OFFLINE``, or ``TRANSFORMERS_OFFLINE``, set to 1/true)."""
    return _flag("HF_HUB_OFFLINE") or _flag("TRANSFORMERS_OFFLINE")


def hf_cache_dir() -> Path:
    """The HF hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def is_hub_id(value: str) -> bool:
    """Whether ``value`` has the shape of a hub id (``namespace/name``); local paths are checked first by callers."""
    text = value.strip()
    return "/" in text and bool(_HUB_ID.match(text)) and ".." not in text and not text.startswith(("./", "/", "~"))


def _describe(repo_id: str, revision: str | None, repo_type: str) -> str:
    kind = "dataset" if repo_type == "dataset" else "model"
    return f"{kind} {repo_id!r}" + (f" at revision {revision!r}" if revision else "")


def _from_modelscope(repo_id: str, revision: str | None, repo_type: str) -> Path:
    snapshot_download = import_extra(
        "modelscope", "a hub id with USE_MODELSCOPE set (ModelScope)", "roll-pipelines", "modelscope"
    ).snapshot_download
    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    if repo_type == "dataset":
        kwargs["repo_type"] = "dataset"
    try:
        return Path(snapshot_download(repo_id, **kwargs))
    except Exception as e:  # ModelScope's own errors have no common base class
        raise HubError(
            f"ModelScope could not provide {_describe(repo_id, revision, repo_type)} ({type(e).__name__}: {e}); "
            f"check the id, or unset USE_MODELSCOPE to use the Hugging Face hub"
        ) from e


def _from_hf(repo_id: str, revision: str | None, repo_type: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hf_cache_dir()
    what = _describe(repo_id, revision, repo_type)
    offline = hub_offline()
    try:
        path = snapshot_download(
            repo_id, repo_type=repo_type, revision=revision, cache_dir=str(cache), local_files_only=offline
        )
    except LocalEntryNotFoundError as e:
        if offline:
            raise HubError(
                f"{what} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE is set; download it where the "
                f"hub is reachable (`hf download {repo_id}"
                + (f" --repo-type {repo_type}" if repo_type != "model" else "")
                + (f" --revision {revision}" if revision else "")
                + "`, into that cache or one set with HF_HUB_CACHE), or give a local folder"
            ) from e
        raise HubError(
            f"{what} could not be downloaded and is not in the Hugging Face cache {cache} ({e}); check the network "
            f"or give a local folder"
        ) from e
    except Exception as e:  # unknown repo or revision, gated repo, HTTP errors: all subclasses of different bases
        raise HubError(
            f"the Hugging Face hub could not provide {what} ({type(e).__name__}: {e}); check the id and revision "
            f"(cache: {cache})"
        ) from e
    return Path(str(path))


def resolve_hub_repo(repo_id: str, *, revision: str | None = None, repo_type: str = "model") -> Path:
    """The local folder of hub repo ``repo_id`` (``repo_type`` "model" or "dataset"), downloaded once into the cache.

    ModelScope when ``USE_MODELSCOPE`` is set, the Hugging Face hub otherwise (cache only with ``HF_HUB_OFFLINE``).

    Raises:
        HubError: naming the id, the revision and the cache, with what to do.
        MissingExtraError: ModelScope was asked for and ``modelscope`` is not installed.
    """
    if use_modelscope():
        return _from_modelscope(repo_id, revision, repo_type)
    return _from_hf(repo_id, revision, repo_type)


def cached_hub_repo(repo_id: str, *, revision: str | None = None, repo_type: str = "model") -> Path | None:
    """The Hugging Face cache's snapshot of ``repo_id`` without contacting the hub; None if it is not cached and the
    hub may be contacted (it will be downloaded at run time).

    Raises:
        HubError: it is not cached and ``HF_HUB_OFFLINE`` is set (the error a run would give).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(
            repo_id, repo_type=repo_type, revision=revision, cache_dir=str(hf_cache_dir()), local_files_only=True
        )
    except LocalEntryNotFoundError:
        if hub_offline():
            return _from_hf(repo_id, revision, repo_type)  # raises the offline error
        return None
    return Path(str(path))
