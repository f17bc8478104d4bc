"""Fixtures for the RLVR tests: a private local Ray and asset cache per test module (started only when asked for), a
small mock-backed config builder and a fixed two-row batch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from roll.pipelines.rlvr.config import RLVRConfig
from roll.protocol import DataProto
from roll.runtime.testing import local_ray

TINY_ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory):
    """A private local Ray and asset cache shared by this module's runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLL_CACHE_DIR", str(tmp_path_factory.mktemp("roll-cache")))
        with local_ray(num_cpus=8):
            yield


@pytest.fixture
def make_config() -> Callable[..., RLVRConfig]:
    """Builds a small RLVR config on mock workers (groups of 2, math reward); keyword arguments override its fields."""

    def build(**overrides: object) -> RLVRConfig:
        data = {
            "pipeline_cls": "rlvr",
            "actor_train": {**TINY_ROLE, "data_args": {"file_name": "synthetic://arithmetic_prompts?n=8"}},
            "actor_infer": {**TINY_ROLE, "generating_args": {"num_return_sequences": 2}},
            "rewards": {"math": {"reward_type": "math"}},
            "response_length": 4,
            **overrides,
        }
        return RLVRConfig.model_validate(data)

    return build


@pytest.fixture
def batch() -> Callable[[], DataProto]:
    """Builds a fresh copy of one group of two scored responses with student and teacher log-probs."""

    def build() -> DataProto:
        return DataProto.from_dict(
            {
                "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
                "scores": torch.tensor([1.0, 0.0]),
                "group_index": torch.tensor([0, 0]),
                "old_log_probs": torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]]),
                "teacher_log_probs": torch.tensor([[-0.5, -2.5, -9.0], [-0.5, -1.5, 0.0]]),
            },
            {"finish_reason": ["stop", "stop"]},
        )

    return build
