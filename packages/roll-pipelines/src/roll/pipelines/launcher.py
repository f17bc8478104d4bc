"""Running pipelines from configs: assets first, then the pipeline, built and run in explicit steps.

``run_config(config)`` is the whole of ``roll run`` after loading the YAML::

    config = resolve_assets(config, run_recipe=run_cached_recipe)   # a new config: every reference is a local path
    with pipeline_cls(config) as pipeline:                         # stores the config; starts nothing
        pipeline.setup()                                           # data, session, roles, wiring
        return pipeline.run()

A ``recipe://name`` reference is the HF export of another pipeline's run: :func:`run_cached_recipe` trains it
once (through :func:`run_config`) and caches it, before the pipeline that needs it exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from roll.pipelines.assets import resolve_assets
from roll.pipelines.base import BasePipeline
from roll.pipelines.cache import cache_dir, write_stamp
from roll.pipelines.config import BaseConfig, load_config
from roll.pipelines.recipes import recipe_data
from roll.pipelines.registry import resolve_pipeline

__all__ = ["TRAINED_RECIPES", "build_pipeline", "prepare_config", "run_cached_recipe", "run_config"]

logger = logging.getLogger(__name__)

# (recipe, wall seconds) of every cached recipe this process trained, for the end-of-run report.
TRAINED_RECIPES: list[tuple[str, float]] = []


def prepare_config(config: BaseConfig) -> BaseConfig:
    """A new config with every ``tiny://``, ``recipe://``, ``smollm2://``, ``synthetic://`` and local reference
    resolved to a local path (recipes are trained first if no finished run is cached)."""
    return resolve_assets(config, run_recipe=run_cached_recipe)


def build_pipeline(config: BaseConfig) -> BasePipeline:
    """The pipeline named by ``config.pipeline_cls``, on the asset-resolved config; nothing is started yet."""
    config = prepare_config(config)
    pipeline: BasePipeline = resolve_pipeline(config.pipeline_cls)(config)
    return pipeline


def run_config(config: BaseConfig) -> Any:
    """Resolve assets, build the pipeline named by ``config.pipeline_cls``, set it up and run it; it is shut down
    whatever happens."""
    with build_pipeline(config) as pipeline:
        pipeline.setup()
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
    started = time.perf_counter()
    run_config(config)
    TRAINED_RECIPES.append((name, time.perf_counter() - started))
    if not export.is_dir():
        raise RuntimeError(f"recipe {name} finished without writing {export}")
    write_stamp(stamp, {"recipe": name, "overrides": overrides})
    return export
