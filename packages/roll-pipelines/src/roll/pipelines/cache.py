"""roll's cache folder (``$ROLL_CACHE_DIR``, default ``~/.cache/roll``) and atomic stamp files in it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "write_stamp"]


def cache_dir() -> Path:
    return Path(os.environ.get("ROLL_CACHE_DIR") or Path.home() / ".cache" / "roll").expanduser()


def write_stamp(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (a crash leaves the old file or none)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)
