"""Distillation pieces without Ray: packing the teacher's top-k, unpacking it on the student, the student's loss,
and the config (ROLL's flat keys, settings)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roll.pipelines.algorithms import gather_student_logits, kd_divergence, kd_loss, teacher_topk
from roll.pipelines.distill.config import DistillConfig
from roll.pipelines.distill.settings import StudentSettings
from roll.pipelines.distill.transfer import _concat, index_dtype, pack_topk, target_mask, unpack_topk
from roll.pipelines.distill.workers import student_loss
from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import LossScale
from roll.strategies.ops import language_model_loss

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}


def sft_batch() -> DataProto:
    # Row 0: prompt [5, 6], response [7, 8]; row 1: prompt [5], response [9], then padding.
    ids = torch.tensor([[5, 6, 7, 8], [5, 9, 0, 0]])
    labels = torch.tensor([[-100, -100, 7, 8], [-100, 9, -100, -100]])
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
            "labels": labels,
            "loss_mask": labels != -100,
        }
    )


def test_target_mask_is_the_shifted_loss_mask_or_every_real_next_token():
    batch = sft_batch()
    assert target_mask(batch).tolist() == [[False, True, True], [True, False, False]]
    assert target_mask(batch, on_prompt=True).tolist() == [[True, True, True], [True, False, False]]


def test_pack_keeps_only_target_positions_and_unpack_restores_them():
    batch = sft_batch()
    mask = target_mask(batch)
    logits = torch.randn(2, 3, 10)
    top = teacher_topk(logits, 4)
    packed = pack_topk(top.log_probs, top.indices.to(torch.int32), mask, vocab_size=10)
    assert packed["row_offsets"].tolist() == [0, 2, 3]
    assert packed["indices"].dtype == np.uint16 and packed["log_probs"].shape == (3, 4)
    dense = unpack_topk(packed, mask, 4)
    assert torch.equal(dense["teacher_ids"][mask], top.indices[mask])
    assert torch.equal(dense["teacher_log_probs"][mask], top.log_probs[mask])
    assert dense["teacher_log_probs"][~mask].abs().sum() == 0
    # rows split across two shards come back as one
    rows0 = {"row_offsets": packed["row_offsets"][:2], **{k: packed[k][:2] for k in ("indices", "log_probs")}}
    rows1 = {"row_offsets": packed["row_offsets"][1:] - 2, **{k: packed[k][2:] for k in ("indices", "log_probs")}}
    joined = _concat([rows0, rows1])
    assert all(np.array_equal(joined[k], packed[k]) for k in packed)
    with pytest.raises(ConfigError, match="distilled tokens per row"):
        unpack_topk(packed, target_mask(batch, on_prompt=True), 4)
    assert index_dtype(1 << 16) == np.uint16 and index_dtype((1 << 16) + 1) == np.int32


def test_student_loss_mixes_cross_entropy_and_the_divergence_by_weight():
    batch = sft_batch()
    mask = target_mask(batch)
    teacher = teacher_topk(torch.randn(2, 3, 10), 4)
    batch = batch.union(
        DataProto.from_dict(unpack_topk(pack_topk(teacher.log_probs, teacher.indices, mask, 10), mask, 4))
    )
    logits = torch.randn(2, 4, 10)
    scale = LossScale(num_tokens=3, num_seqs=2)
    ce, _ = language_model_loss(logits, batch.batch["labels"], num_tokens=3)
    per_token = kd_divergence(gather_student_logits(logits[:, :-1], teacher.indices), teacher.log_probs, "reverse_kl")
    kd = kd_loss(per_token, mask, num_tokens=3)
    for w in (0.0, 0.3, 1.0):
        settings = StudentSettings(kd_objective="reverse_kl", distill_loss_weight=w)
        loss, metrics = student_loss(settings, batch, logits, scale)
        assert float(loss) == pytest.approx(float((1 - w) * ce + w * kd), rel=1e-6)
        assert ("student/distill_loss@share" in metrics) == (w > 0)  # shares of the loss, summed by the strategy
        assert metrics["student/ce_loss@share"] == pytest.approx(float(ce), rel=1e-6)


def test_config_takes_rolls_flat_keys_and_resolves_worker_settings():
    config = DistillConfig.model_validate(
        {
            "pipeline_cls": "distill",
            "student": {**ROLE, "data_args": {"file_name": "x.jsonl", "max_length": 32}},
            "teacher": ROLE,
            "logits_topk": 16,
            "kd_objective": "skewed_reverse_kl",
            "kd_temperature": 2.0,
            "teacher_temperature": 1.5,
            "distill_loss_weight": 0.7,
            "skew_lambda": 0.2,
        }
    )
    assert config.distill.logits_topk == 16 and config.distill.kd_objective == "skewed_reverse_kl"
    assert config.teacher_settings().temperature == 3.0  # kd x teacher temperature, as ROLL scales the teacher
    assert config.student_settings().kd_temperature == 2.0 and config.student_settings().skew_lambda == 0.2
    with pytest.raises(ValueError, match="kd_objective"):
        DistillConfig.model_validate({**config.model_dump(exclude_unset=True), "distill": {"kd_objective": "tv"}})
    with pytest.raises(ValueError, match="max_length"):
        DistillConfig.model_validate(
            {"pipeline_cls": "distill", "student": {**ROLE, "data_args": {"file_name": "x"}}, "teacher": ROLE}
        )
