"""Built-in recipes: tiny CPU defaults runnable as is (``roll run sft-tiny``), shipped as package data.

Recipes live here and in the ``recipes/`` folder of any other ``roll.*`` package (e.g. roll.agentic's), found by
path without importing those packages.
"""

from __future__ import annotations

from pathlib import Path

import yaml

__all__ = ["list_recipes", "recipe_path"]

_DIR = Path(__file__).parent


def _recipe_files() -> list[Path]:
    """Every recipe file: this folder's first, then those of other roll.* packages (first name wins)."""
    import roll  # pants: no-infer-dep (the namespace package itself, to list its folders)

    folders = [_DIR]
    for root in getattr(roll, "__path__", []):
        folders += sorted(p for p in Path(root).glob("*/recipes") if p.is_dir() and p.resolve() != _DIR.resolve())
    seen: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            seen.setdefault(path.stem, path)
    return list(seen.values())


def _description(text: str) -> str:
    """A recipe's one-line description: the first line of its leading comment, plus the lines that continue its last
    sentence (a line that starts in lower case, or follows one ending in ``,;:-(``), joined."""
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line[1:].strip())
    parts: list[str] = []
    for line in comment:
        if not line:
            if parts:
                break
            continue
        if parts and not (line[0].islower() or parts[-1].endswith((",", ";", ":", "-", "("))):
            break
        parts.append(line)
    return " ".join(parts)


def list_recipes() -> dict[str, str]:
    """Recipe name -> its description (the leading comment's first line, with the lines that finish its sentence)."""
    return {path.stem: _description(path.read_text()) for path in sorted(_recipe_files(), key=lambda p: p.stem)}


def recipe_path(name: str) -> Path:
    path = next((p for p in _recipe_files() if p.stem == name), _DIR / f"{name}.yaml")
    if not path.is_file():
        from roll.runtime import ConfigError  # here, so `roll recipes` starts without Ray

        raise ConfigError(
            f"{name!r} is neither a config file nor a built-in recipe; recipes: {', '.join(list_recipes())}"
        )
    return path


def recipe_data(name: str) -> dict:
    return yaml.safe_load(recipe_path(name).read_text())
