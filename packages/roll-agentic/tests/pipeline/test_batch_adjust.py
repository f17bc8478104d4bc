"""batch_adjust_mode random_sample and auto (ROLL's AgenticPipeline.adjust_batch), on hand-made batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roll.agentic.pipeline import AgenticConfig
from roll.agentic.pipeline.adjust import adjust_batch, batch_unit
from roll.protocol import DataProto
from roll.runtime import ConfigError


def _batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"scores": torch.arange(rows, dtype=torch.float32)},
        non_tensors={"traj_id": np.array([f"t{i}" for i in range(rows)], dtype=object)},
    )


def _rows(batch: DataProto) -> list[int]:
    ids = [int(s) for s in batch.batch["scores"].tolist()]
    assert [f"t{i}" for i in ids] == list(batch.non_tensor_batch["traj_id"])  # columns stay aligned
    return ids


def test_batch_unit_is_roll_size_divide() -> None:
    # actor_train: 2 rows x 4 accumulation x 2 ranks = 16; forward batches 3 x 2 ranks = 6 -> lcm 48
    assert batch_unit(2 * 4 * 2, [3 * 2]) == 48
    assert batch_unit(8, [8, 4]) == 8


def test_random_sample_keeps_one_unit_of_distinct_rows_in_order() -> None:
    kept = _rows(adjust_batch(_batch(21), 2, "random_sample", unit=8, seed=3))
    assert len(kept) == 8 and kept == sorted(set(kept)) and set(kept) <= set(range(21))
    # the same draw as numpy's seeded choice without replacement (ROLL's rule), sorted back into order
    expected = np.sort(np.random.default_rng(3).choice(21, 8, replace=False)).tolist()
    assert kept == expected
    assert _rows(adjust_batch(_batch(21), 2, "random_sample", unit=8, seed=3)) == kept  # seeded: reproducible
    assert _rows(adjust_batch(_batch(21), 2, "random_sample", unit=8, seed=4)) != kept


def test_random_sample_leaves_a_multiple_of_the_unit_alone() -> None:
    assert _rows(adjust_batch(_batch(16), 2, "random_sample", unit=8, seed=0)) == list(range(16))


def test_random_sample_copies_up_to_one_unit_when_short() -> None:
    out = _rows(adjust_batch(_batch(5), 2, "random_sample", unit=8, seed=1))
    assert out[:5] == [0, 1, 2, 3, 4] and len(out) == 8
    extra = out[5:]
    assert len(set(extra)) == 3 and set(extra) <= set(range(5))  # 3 <= 5 rows: drawn without replacement
    tiny = _rows(adjust_batch(_batch(2), 2, "random_sample", unit=8, seed=1))
    assert len(tiny) == 8 and tiny[:2] == [0, 1] and set(tiny) == {0, 1}  # 6 > 2 rows: with replacement


@pytest.mark.parametrize("rows", [1, 7, 9, 15, 17, 33])
def test_random_sample_result_splits_over_the_ranks(rows: int) -> None:
    out = adjust_batch(_batch(rows), 4, "random_sample", unit=8, seed=rows)
    assert len(out) % 8 == 0 and len(out) % 4 == 0


def test_random_sample_rejects_a_unit_the_ranks_do_not_divide() -> None:
    with pytest.raises(ConfigError, match="batch unit 6 is not a multiple of actor_train's 4"):
        adjust_batch(_batch(7), 4, "random_sample", unit=6)


def test_auto_copies_when_half_would_go_else_deletes() -> None:
    assert _rows(adjust_batch(_batch(9), 4, "auto")) == list(range(8))  # surplus 1 of 9: delete
    assert _rows(adjust_batch(_batch(3), 4, "auto")) == [0, 1, 2, 0]  # fewer rows than ranks: copy


def test_config_accepts_roll_modes() -> None:
    role = {"model_name_or_path": "/models/tiny"}
    cfg = AgenticConfig.model_validate(
        {
            "actor_train": {"model_args": role},
            "actor_infer": {"model_args": role},
            "custom_envs": {"Lake": {"env_type": "frozen_lake"}},
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
            "rollout_batch_size": 4,
            "batch_adjust_mode": "random_sample",
        }
    )
    assert cfg.update.batch_adjust_mode == "random_sample"


def test_pipeline_batch_unit_counts_every_role_like_roll() -> None:
    from types import SimpleNamespace

    from roll.agentic.pipeline import AgenticPipeline

    def role(per_device: int, accumulation: int, infer: int) -> SimpleNamespace:
        args = SimpleNamespace(per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
        return SimpleNamespace(training_args=args, infer_batch_size=infer)

    pipeline = AgenticPipeline.__new__(AgenticPipeline)
    pipeline.config = SimpleNamespace(actor_train=role(2, 2, 4), reference=role(1, 1, 3), critic=None)  # type: ignore[assignment]
    pipeline.actor_train = SimpleNamespace(dp_size=2)  # type: ignore[assignment]
    pipeline.reference, pipeline.critic = SimpleNamespace(dp_size=1), None  # type: ignore[assignment]
    assert pipeline.batch_unit() == 24  # lcm(2*2*2 train, 4*2 actor forward, 3*1 reference forward)
    pipeline.config.critic, pipeline.critic = role(1, 5, 2), SimpleNamespace(dp_size=1)  # type: ignore[assignment]
    assert pipeline.batch_unit() == 120  # and the critic's 5-row train / 2-row forward batches
