"""roll.pipelines (not yet implemented: see the project issues)."""

from __future__ import annotations

__all__: list[str] = []
