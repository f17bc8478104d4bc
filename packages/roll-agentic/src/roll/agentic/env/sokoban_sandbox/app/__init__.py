"""The files of the ``sokoban_sandbox`` image's ``/app``: roll's game server, its client and the two roll modules
they use (standard library only)::

    python -m roll.agentic.env.sokoban_sandbox.app --write-app ./sokoban-app
    python -m roll.agentic.env.sokoban_sandbox.app --dockerfile > ./sokoban-app/Dockerfile
    docker build -t my-registry/sokoban-sandbox:latest ./sokoban-app

then set ``env_config.image: my-registry/sokoban-sandbox:latest`` in the ``sokoban_sandbox`` entry (ROLL's default
image sits in ROLL's own registry). The image needs ``python`` (3.10 or later) and ``curl`` (the env's health check,
as ROLL's).
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["APP_FILES", "DOCKERFILE", "write_app"]

_HERE = Path(__file__).resolve().parent
_ENV = _HERE.parent.parent  # roll/agentic/env
#: ``/app`` path -> the file it is copied from.
APP_FILES = {
    "server.py": _HERE / "server.py",
    "client.py": _HERE / "client.py",
    "roll/agentic/env/sokoban_gen.py": _ENV / "sokoban_gen.py",
    "roll/agentic/env/parsing.py": _ENV / "parsing.py",
}
DOCKERFILE = """\
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
COPY . /app
WORKDIR /app
"""


def write_app(folder: str | Path) -> Path:
    """Write the app's files into ``folder`` (made if missing; files there of the same names are replaced)."""
    root = Path(folder)
    for name, source in APP_FILES.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return root
