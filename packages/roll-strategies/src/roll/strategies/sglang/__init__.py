"""sglang: rollouts with ``sglang.Engine`` (``pip install 'roll-strategies[sglang]'``; needs CUDA).

Importing this package does not import SGLang; only ``roll.strategies.sglang.strategy`` does, when the backend
is selected.
"""

from __future__ import annotations

from roll.strategies.sglang.config import SglangConfig

__all__ = ["SglangConfig"]
