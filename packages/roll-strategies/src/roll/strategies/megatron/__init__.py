"""megatron_train / megatron_infer: dense Llama/Qwen models on megatron-core (``pip install 'roll-strategies[megatron]'``).

Importing this package never imports megatron: only ``roll.strategies.megatron.strategy`` (which the registry
loads when the backend is selected) and its ``_base`` / ``_engine`` / ``_state`` helpers do. The config, the
HF <-> Megatron weight mapping and the batch helpers are plain torch and work without megatron.
"""

from __future__ import annotations

from roll.strategies.megatron.config import MegatronConfig, check_world_size

__all__ = ["MegatronConfig", "check_world_size"]
