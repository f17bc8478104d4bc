"""Built-in recipes: tiny CPU defaults runnable as is (``roll run sft-tiny``), shipped as package data."""

from __future__ import annotations

from pathlib import Path

import yaml

from roll.runtime import ConfigError

__all__ = ["list_recipes", "recipe_path"]

_DIR = Path(__file__).parent


def list_recipes() -> dict[str, str]:
    """Recipe name -> its one-line description (the YAML's leading comment)."""
    out = {}
    for path in sorted(_DIR.glob("*.yaml")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        out[path.stem] = first.lstrip("# ").strip()
    return out


def recipe_path(name: str) -> Path:
    path = _DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"{name!r} is neither a config file nor a built-in recipe; recipes: {', '.join(list_recipes())}"
        )
    return path


def recipe_data(name: str) -> dict:
    return yaml.safe_load(recipe_path(name).read_text())
