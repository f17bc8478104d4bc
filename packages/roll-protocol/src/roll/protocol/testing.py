"""Assertions for tests that handle DataProtos (roll's own and users')."""

from __future__ import annotations

from typing import Any

import numpy as np

from roll.protocol._dataproto import DataProto
from roll.protocol._optional import is_tensor, tensors


def column_values(dp: DataProto, key: str) -> list[Any]:
    """One key's values as plain Python lists (tensors via ``tolist``, numpy values unwrapped)."""
    values = dp[key]
    if is_tensor(values):
        return list(values.tolist())
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in values.tolist()]


def assert_dataproto_equal(actual: DataProto, expected: DataProto, *, check_meta: bool = False) -> None:
    """Assert two DataProtos hold the same rows: same keys, tensor dtypes and values, column values."""
    assert len(actual) == len(expected), f"lengths differ: {len(actual)} != {len(expected)}"
    assert sorted(actual.keys()) == sorted(expected.keys()), (
        f"keys differ: {sorted(actual.keys())} != {sorted(expected.keys())}"
    )
    for key in expected.keys():
        if key in expected.non_tensor_batch:
            continue
        a, e = actual[key], expected[key]
        assert a.dtype == e.dtype, f"tensor {key!r}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"tensor {key!r}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert tensors("assert_dataproto_equal").torch.equal(a, e), f"tensor {key!r}: values differ"
    for key in expected.non_tensor_batch:
        assert column_values(actual, key) == column_values(expected, key), f"column {key!r}: values differ"
    if check_meta:
        assert actual.meta_info.keys() == expected.meta_info.keys(), "meta_info keys differ"
