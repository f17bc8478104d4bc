"""Running pipelines from configs, and cached runs of built-in recipes (for ``recipe://`` references)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from roll.pipelines.assets import cache_dir, write_stamp
from roll.pipelines.config import BaseConfig, load_config
from roll.pipelines.recipes import recipe_data
from roll.pipelines.registry import resolve_pipeline

__all__ = ["build_pipeline", "run_cached_recipe", "run_config"]

logger = logging.getLogger(__name__)


def build_pipeline(config: BaseConfig) -> Any:
    return resolve_pipeline(config.pipeline_cls)(config)


def run_config(config: BaseConfig) -> Any:
    """Build the pipeline named by ``config.pipeline_cls``, run it, and shut it down whatever happens."""
    pipeline = build_pipeline(config)
    with pipeline:
        return pipeline.run()


def run_cached_recipe(name: str, overrides: list[str] | None = None) -> Path:
    """The HF export of recipe ``name`` (with ``overrides``), training it first if no finished run is cached.

    An interrupted cached run resumes from its last checkpoint the next time.
    """
    overrides = list(overrides or [])
    fingerprint = hashlib.sha256(
        (yaml.safe_dump(recipe_data(name), sort_keys=True) + json.dumps(overrides)).encode()
    ).hexdigest()[:12]
    out = cache_dir() / "recipes" / f"{name}-{fingerprint}"
    stamp = out / "DONE.json"
    export = out / "hf_export"
    if stamp.is_file() and export.is_dir():
        logger.info("using cached %s from %s", name, export)
        return export
    logger.info("training %s once (cached in %s)", name, out)
    config = load_config(
        name,
        [*overrides, f"output_dir={out}", "resume_from_checkpoint=auto", "export_hf=true", f"exp_name={name}"],
    )
    run_config(config)
    if not export.is_dir():
        raise RuntimeError(f"recipe {name} finished without writing {export}")
    write_stamp(stamp, {"recipe": name, "overrides": overrides})
    return export
