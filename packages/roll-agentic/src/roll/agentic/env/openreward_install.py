"""Install the OpenReward SDK beside the ``mcp`` extra: ``python -m roll.agentic.env.openreward_install [PIP_ARGS]``.

The SDK pins ``sse-starlette==2.3.6`` and the mcp SDK needs 3.x, so pip cannot install the ``openreward`` and
``mcp`` extras together. This installs the SDK that roll-agentic's ``openreward`` extra names without its
dependencies, then those dependencies but ``sse-starlette`` (the SDK runs with the 3.x the mcp extra brings), read
from the SDK's own metadata, so a new SDK version brings its own list. ``PIP_ARGS`` go to the second install (e.g. a
torch pin that keeps pip from replacing the installed build). ``./tools/dev setup`` installs the dev venv's SDK so.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

__all__ = ["SKIPPED", "main", "sdk_requirements", "sdk_spec"]

SKIPPED = frozenset({"sse-starlette"})
"""The SDK's requirements left out: it runs with the version the mcp extra installs."""


def _name(requirement: str) -> str:
    """A requirement's project name, normalized (``SSE_Starlette`` -> ``sse-starlette``)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def _extra_of(marker: str) -> str | None:
    match = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
    return match.group(1) if match else None


def sdk_spec(requires: list[str] | None = None) -> str:
    """The SDK requirement of roll-agentic's ``openreward`` extra (``requires``: roll-agentic's ``Requires-Dist``;
    None reads the installed roll-agentic's), without its marker."""
    if requires is None:
        requires = importlib.metadata.requires("roll-agentic") or []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if _extra_of(marker) == "openreward" and _name(spec) == "openreward":
            return spec.strip()
    raise SystemExit("roll-agentic's metadata names no openreward extra: reinstall roll-agentic")


def sdk_requirements(requires: list[str] | None = None) -> list[str]:
    """The SDK's requirements but its extras' and :data:`SKIPPED` (``requires``: its ``Requires-Dist``; None reads
    the installed SDK's), each as the SDK states it, marker included."""
    if requires is None:
        try:
            requires = importlib.metadata.requires("openreward") or []
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit("the OpenReward SDK is not installed (its --no-deps install failed?)") from None
    return [r for r in requires if _extra_of(r.partition(";")[2]) is None and _name(r) not in SKIPPED]


def main(argv: list[str] | None = None) -> int:
    pip_args = sys.argv[1:] if argv is None else argv
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.check_call([*pip, "--no-deps", sdk_spec()])
    importlib.invalidate_caches()
    subprocess.check_call([*pip, *pip_args, *sdk_requirements()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
