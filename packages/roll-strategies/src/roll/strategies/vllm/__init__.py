"""vllm: generation and weight sync on vLLM's offline engine (``pip install roll-strategies[vllm]``).

Importing this package never imports vLLM; :mod:`roll.strategies.vllm.strategy` does so when the engine starts.
"""

from __future__ import annotations

from roll.strategies.vllm.config import VllmConfig

__all__ = ["VllmConfig"]
