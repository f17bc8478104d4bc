"""FSDP2 backends: ``fsdp2_train`` (actor/critic training) and ``fsdp2_infer`` (reference model forward passes).

Importing this package stays cheap (the registry imports :mod:`.config` to validate settings); the strategies are
loaded on first attribute access.
"""

from __future__ import annotations

from typing import Any

from roll.strategies.fsdp2.config import Fsdp2Config

__all__ = ["Fsdp2Config", "Fsdp2InferStrategy", "Fsdp2TrainStrategy"]


def __getattr__(name: str) -> Any:
    if name in ("Fsdp2InferStrategy", "Fsdp2TrainStrategy"):
        from roll.strategies.fsdp2 import strategy

        return getattr(strategy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
