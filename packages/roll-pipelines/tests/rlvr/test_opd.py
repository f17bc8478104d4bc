"""On-policy distillation in RLVR (ROLL's is_pure_opd / use_opd): config keys and the training targets."""

from __future__ import annotations

import pytest
import torch

from roll.pipelines.algorithms import grpo_advantages
from roll.pipelines.config import load_config
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.config import RLVRConfig

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}
DATA = {"file_name": "synthetic://arithmetic_prompts?n=8"}


def test_pure_opd_advantage_is_the_teacher_log_ratio_per_token_and_ignores_scores(make_config, batch):
    config = make_config(is_pure_opd=True, teacher={**ROLE, "opd_kl_coef": 2.0})
    data = batch()
    metrics = compute_training_targets(data, config, 0.0)
    # -2 * (student - teacher) on valid tokens: row 0 (-1 - -0.5, -2 - -2.5) -> (1.0, -1.0); row 1 (0, 1, -0.5)
    expected = torch.tensor([[1.0, -1.0, 0.0], [0.0, -2.0, 1.0]])
    torch.testing.assert_close(data.batch["advantages"], expected)
    torch.testing.assert_close(data.batch["returns"], expected)
    assert metrics["opd/reverse_kl"] == pytest.approx((-0.5 + 0.5 + 0.0 + 1.0 - 0.5) / 5)


def test_mixed_opd_adds_the_teacher_term_to_the_reward_advantage(make_config, batch):
    config = make_config(use_opd=True, teacher=ROLE)  # opd_kl_coef defaults to 1
    data = batch()
    compute_training_targets(data, config, 0.0)
    grpo, _ = grpo_advantages(batch().batch["scores"], batch().batch["response_mask"], batch().batch["group_index"])
    opd = -(batch().batch["old_log_probs"] - batch().batch["teacher_log_probs"]) * batch().batch["response_mask"]
    torch.testing.assert_close(data.batch["advantages"], grpo + opd)


def test_opd_keys_roll_spellings_and_errors(make_config):
    config = make_config(is_pure_opd=True, teacher=ROLE)
    assert config.opd.pure and not config.opd.mixed and config.opd.penalty == "k1"
    assert config.teacher is not None and config.teacher.opd_kl_coef == 1.0
    # ROLL's pure-OPD role names, and a group size of one (no group baseline in pure OPD)
    data = {
        "pipeline_cls": "rlvr",
        "is_pure_opd": True,
        "student_train": {**ROLE, "data_args": DATA},
        "student_infer": {**ROLE, "generating_args": {"num_return_sequences": 1}},
        "teacher": ROLE,
        "rewards": {"math": {"reward_type": "math"}},
    }
    mapped = RLVRConfig.model_validate(data)
    assert mapped.actor_train.data_args is not None and mapped.actor_infer.name == "actor_infer"
    with pytest.raises(ValueError, match="exclusive"):
        make_config(is_pure_opd=True, use_opd=True, teacher=ROLE)
    with pytest.raises(ValueError, match="teacher role"):
        make_config(use_opd=True)
    with pytest.raises(ValueError, match="opd.score_rollouts applies to pure OPD"):
        make_config(use_opd=True, teacher=ROLE, opd={"score_rollouts": True})
    assert make_config(is_pure_opd=True, teacher=ROLE, opd={"score_rollouts": True}).opd.score_rollouts
    with pytest.raises(ValueError, match="student_train and actor_train"):
        RLVRConfig.model_validate({**data, "actor_train": {**ROLE, "data_args": DATA}})
    # an override names the role as the file does (student_train.x) and lands on it, not on a second role;
    # ROLL's dict of teachers takes overrides under its own key too
    teachers = {"math_teacher": {**ROLE, "tag_included": ["math"]}}
    loaded = load_config(
        {**data, "teacher": teachers},
        ["student_train.model_args.dtype=float32", "actor_infer.world_size=2", "teacher.math_teacher.world_size=3"],
    )
    assert isinstance(loaded, RLVRConfig) and loaded.actor_train.model_args.dtype == "float32"
    assert loaded.actor_infer.world_size == 2 and loaded.teachers["math_teacher"].world_size == 3
