"""Dense on-policy distillation (roll's ``opd.dense_objective``): the divergence on hand-computed toys, the config
keys, the teacher's settings and the training targets (the sampled-token advantage replaced or kept)."""

from __future__ import annotations

import math

import pytest
import torch

from roll.pipelines.algorithms import opd_dense_divergence
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.settings import ActorSettings, PolicySettings
from roll.runtime import ConfigError

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}


# Teacher (0.8, 0.2) against a uniform student (logits 0, 0) over a 2-token vocabulary.
TEACHER = torch.log(torch.tensor([[0.8, 0.2]]))
FORWARD = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)  # 0.192745
REVERSE = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)  # 0.223144


def _value_and_grad(objective: str, logits: list[float]) -> tuple[float, list[float]]:
    student = torch.tensor([logits], requires_grad=True)
    value = opd_dense_divergence(student, TEACHER, None, objective)
    value.sum().backward()
    assert student.grad is not None
    return float(value.detach()[0]), student.grad[0].tolist()


def test_forward_kl_on_a_two_token_toy_pushes_the_teachers_token_up():
    value, grad = _value_and_grad("forward_kl", [0.0, 0.0])
    assert value == pytest.approx(FORWARD, abs=1e-6)
    # d/dz KL(p || softmax(z)) = q - p = (0.5 - 0.8, 0.5 - 0.2)
    assert grad == pytest.approx([-0.3, 0.3], abs=1e-6)


def test_reverse_kl_on_a_two_token_toy_pushes_the_teachers_token_up():
    value, grad = _value_and_grad("reverse_kl", [0.0, 0.0])
    assert value == pytest.approx(REVERSE, abs=1e-6)
    # d/dz_i KL(q || p) = q_i (log q_i - log p_i - KL)
    expected = [0.5 * (math.log(0.5 / 0.8) - REVERSE), 0.5 * (math.log(0.5 / 0.2) - REVERSE)]
    assert grad == pytest.approx(expected, abs=1e-6)
    assert grad[0] < 0 < grad[1]  # a descent step raises the teacher's token 0, whichever token was sampled


def test_dense_divergence_is_zero_at_the_teacher_and_scales_the_student_by_the_temperature():
    value, grad = _value_and_grad("forward_kl", [math.log(0.8), math.log(0.2)])
    assert value == pytest.approx(0.0, abs=1e-6) and grad == pytest.approx([0.0, 0.0], abs=1e-6)
    # temperature 2: the student's logits (2 ln 0.8, 2 ln 0.2) / 2 are the teacher's distribution again
    student = torch.tensor([[2 * math.log(0.8), 2 * math.log(0.2)]])
    assert float(opd_dense_divergence(student, TEACHER, None, "reverse_kl", temperature=2.0)[0]) == pytest.approx(
        0.0, abs=1e-6
    )


def test_dense_divergence_on_the_teachers_top_k_renormalises_the_student_over_those_ids():
    # vocabulary 3; the teacher's top-2 are ids 2 and 0 with renormalised (0.75, 0.25)
    student = torch.tensor([[math.log(0.2), math.log(0.5), math.log(0.3)]])
    teacher = torch.log(torch.tensor([[0.75, 0.25]]))
    indices = torch.tensor([[2, 0]])
    # the student over {2, 0}: (0.3, 0.2) / 0.5 = (0.6, 0.4)
    expected = 0.75 * math.log(0.75 / 0.6) + 0.25 * math.log(0.25 / 0.4)
    value = opd_dense_divergence(student, teacher, indices, "forward_kl")
    assert float(value[0]) == pytest.approx(expected, abs=1e-6)


def test_dense_keys_are_validated(make_config):
    teacher = {**ROLE, "opd_kl_coef": 0.5}
    config = make_config(is_pure_opd=True, teacher=teacher, opd={"dense_objective": "forward_kl", "dense_topk": 2})
    assert config.opd.dense and not config.opd.sampled and config.opd.dense_mode == "replace"
    assert config.teacher_settings() == PolicySettings(temperature=1.0, dense_topk=2)
    actor = config.actor_settings()
    assert (actor.opd_dense_objective, actor.opd_dense_coef) == ("forward_kl", 0.5)
    plain = make_config(is_pure_opd=True, teacher=teacher)  # ROLL's OPD is unchanged
    assert plain.teacher_settings().dense_topk is None and plain.actor_settings().opd_dense_objective is None
    assert plain.opd.sampled
    with pytest.raises(ValueError, match="needs on-policy distillation"):
        make_config(teacher=teacher, opd={"dense_objective": "forward_kl"})
    with pytest.raises(ValueError, match="dense_objective is not"):
        make_config(is_pure_opd=True, teacher=teacher, opd={"dense_topk": 8})
    with pytest.raises(ValueError, match="dense_objective"):
        make_config(is_pure_opd=True, teacher=teacher, opd={"dense_objective": "forward"})
    with pytest.raises(ValueError, match="one teacher"):
        make_config(is_pure_opd=True, teachers={"a": ROLE, "b": ROLE}, opd={"dense_objective": "reverse_kl"})
    with pytest.raises(ConfigError, match="opd_dense_objective"):
        ActorSettings(opd_dense_objective="kl")


def test_dense_replace_zeroes_the_sampled_advantage_and_add_keeps_it(make_config, batch):
    replace = make_config(is_pure_opd=True, teacher=ROLE, opd={"dense_objective": "reverse_kl"})
    data = batch()
    metrics = compute_training_targets(data, replace, 0.0)
    assert float(data.batch["advantages"].abs().sum()) == 0.0
    assert metrics["opd/advantage_mean"] == 0.0
    assert metrics["opd/reverse_kl"] == pytest.approx((-0.5 + 0.5 + 0.0 + 1.0 - 0.5) / 5)  # still reported
    add = make_config(is_pure_opd=True, teacher=ROLE, opd={"dense_objective": "reverse_kl", "dense_mode": "add"})
    data = batch()
    compute_training_targets(data, add, 0.0)
    expected = -(batch().batch["old_log_probs"] - batch().batch["teacher_log_probs"]) * batch().batch["response_mask"]
    torch.testing.assert_close(data.batch["advantages"], expected)
