from __future__ import annotations

import numpy as np
import pytest
import torch

from roll.protocol import DataProto
from roll.protocol.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (roll's markers)


@pytest.fixture
def mixed() -> DataProto:
    n = 7
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(n * 4, dtype=torch.int64).reshape(n, 4),
            "log_probs": torch.linspace(-3, 0, n * 4, dtype=torch.float32).reshape(n, 4),
            "mask": torch.tensor([[1, 1, 0, 0]] * n, dtype=torch.bool),
        },
        non_tensors={
            "prompt": [f"prompt {i}" for i in range(n)],
            "tag": ["math", "code", "math", None, "code", "math", "qa"],
            "answers": [[i, i + 1] if i % 2 else [] for i in range(n)],
            "score": np.arange(n, dtype=np.float64) / 2,
        },
        meta_info={"global_step": 3},
    )
