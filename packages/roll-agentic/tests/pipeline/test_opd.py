"""On-policy distillation in the agentic pipeline (ROLL's ``is_pure_opd`` / ``use_opd`` with
``pure_opd_pipeline_type: agentic``): config, the advantage on hand-made episodes, and runs on a nano model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from roll.agentic.pipeline import AgenticConfig, register_pipelines
from roll.agentic.pipeline.advantage import compute_agentic_targets
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics
from roll.protocol import DataProto

ROLE = {"model_name_or_path": "/models/tiny"}
NANO = "tiny://nano?seed=0"


def _data(**extra: Any) -> dict[str, Any]:
    return {
        "actor_train": {"model_args": ROLE},
        "actor_infer": {"model_args": ROLE},
        "custom_envs": {"Lake": {"env_type": "frozen_lake"}, "Box": {"env_type": "sokoban"}},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake", "Box"]},
        "rollout_batch_size": 4,
        **extra,
    }


def _config(**extra: Any) -> AgenticConfig:
    return AgenticConfig.model_validate(AgenticConfig.normalize(_data(**extra)))


# --- config -----------------------------------------------------------------------------------------------------
def test_roll_spelling_of_pure_opd_reads_as_roll_writes_it():
    data = _data(is_pure_opd=True, teacher={"model_args": ROLE, "opd_kl_coef": 0.5}, opd_kl_penalty="k3")
    data["student_train"], data["student_infer"] = data.pop("actor_train"), data.pop("actor_infer")
    config = AgenticConfig.model_validate(AgenticConfig.normalize(data))
    assert config.opd.pure and not config.opd.mixed and config.opd.penalty == "k3"
    assert list(config.teacher_roles()) == ["teacher"]
    assert config.teacher_roles()["teacher"].opd_kl_coef == 0.5
    assert config.actor_settings().opd_dense_objective is None


def test_several_teachers_under_teacher_become_teachers_routed_by_env_tag():
    teachers = {"lake": {"model_args": ROLE, "tag_included": ["Lake"]}, "box": {"model_args": ROLE}}
    config = _config(use_opd=True, teacher=teachers)
    assert config.teacher is None and sorted(config.teachers or {}) == ["box", "lake"]
    assert config.teacher_tags_of() == {"lake": ["Lake"], "box": []}


def test_dense_opd_reaches_the_actors_loss_settings():
    config = _config(
        is_pure_opd=True, teacher={"model_args": ROLE, "opd_kl_coef": 2.0}, opd={"dense_objective": "forward_kl"}
    )
    settings = config.actor_settings()
    assert settings.opd_dense_objective == "forward_kl" and settings.opd_dense_coef == 2.0
    assert config.teacher_settings().dense_topk == 0  # the whole vocabulary unless opd.dense_topk says otherwise


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"teacher": {"model_args": ROLE}}, "on-policy distillation is off"),
        ({"is_pure_opd": True}, "need a teacher role"),
        (
            {"is_pure_opd": True, "teacher": {"model_args": ROLE, "tag_included": ["Lakes"]}},
            r"teacher 'teacher': tag_included names \['Lakes'\], which match no env tag \(env tags: Lake, Box",
        ),
        (
            {"is_pure_opd": True, "teacher": {"model_args": ROLE, "tag_included": ["Lake"]}},
            r"training env tag\(s\) \['Box'\] are routed to no teacher",
        ),
        ({"is_pure_opd": True, "use_opd": True, "teacher": {"model_args": ROLE}}, "exclusive"),
        (
            {"is_pure_opd": True, "teacher": {"model_args": ROLE}, "opd": {"score_rollouts": True}},
            "always reports the env's reward and success",
        ),
        (
            {
                "is_pure_opd": True,
                "teacher": {"model_args": ROLE},
                "add_token_level_kl": True,
                "reference": {"model_args": ROLE},
            },
            "would be ignored",
        ),
        ({"is_pure_opd": True, "teacher": {"model_args": ROLE}, "critic": {"model_args": ROLE}}, "no returns to fit"),
    ],
)
def test_opd_config_mistakes_get_one_clear_error(extra: dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        _config(**extra)


def test_pure_opd_needs_no_reward_groups():
    config = _config(
        is_pure_opd=True,
        teacher={"model_args": ROLE},
        train_env_manager={"num_env_groups": 4, "group_size": 1, "tags": ["Lake"]},
    )
    assert config.opd.pure  # GRPO of one episode per group would have no baseline; pure OPD uses no estimator
    # only the training tags need a teacher: Box, an env tag no training episode plays, may have none
    routed = _config(
        is_pure_opd=True,
        teacher={"model_args": ROLE, "tag_included": ["Lake"]},
        train_env_manager={"num_env_groups": 4, "group_size": 1, "tags": ["Lake"]},
    )
    assert routed.teacher_tags_of() == {"teacher": ["Lake"]}


def test_mixed_opd_keeps_the_estimators_own_checks():
    with pytest.raises(ValueError, match="every advantage is 0"):
        _config(
            use_opd=True,
            teacher={"model_args": ROLE},
            train_env_manager={"num_env_groups": 4, "group_size": 1, "tags": ["Lake"]},
        )


# --- advantage --------------------------------------------------------------------------------------------------
def _episodes() -> DataProto:
    """Two Lake and one Box episode: student and teacher log-probs on each assistant token."""
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    student = torch.tensor([[-1.0, -2.0, -9.0, -0.5], [-1.5, -9.0, -9.0, -9.0], [-0.2, -0.4, -0.6, -9.0]])
    teacher = torch.tensor([[-0.5, -1.0, -1.0, -1.0], [-0.5, -1.0, -1.0, -1.0], [-0.1, -0.1, -0.1, -1.0]])
    tensors = {
        "response_mask": mask,
        "responses": torch.zeros(3, 4).long(),
        "scores": torch.tensor([1.0, 0.0, 1.0]),
        "old_log_probs": student,
        "teacher_log_probs": teacher,
        "teacher_rows": torch.ones(3, dtype=torch.bool),
    }
    return DataProto.from_dict(tensors, {"traj_group_id": ["g0", "g0", "g1"], "tag": ["Lake", "Lake", "Box"]})


def test_pure_opd_advantage_is_minus_coef_times_the_log_ratio_on_assistant_tokens():
    batch = _episodes()
    metrics = compute_agentic_targets(
        batch, _config(is_pure_opd=True, teacher={"model_args": ROLE, "opd_kl_coef": 0.5})
    )
    data = batch.batch
    mask = data["response_mask"].float()
    expected = -0.5 * (data["old_log_probs"] - data["teacher_log_probs"]) * mask
    assert torch.allclose(data["advantages"], expected)
    assert torch.equal(data["returns"], data["advantages"])  # as ROLL: no reward, returns = advantages
    assert torch.count_nonzero(data["token_level_rewards"]) == 0
    # token mean of log p_student - log p_teacher over the 6 assistant tokens
    assert metrics["opd/reverse_kl"] == pytest.approx((-0.5 - 1.0 + 0.5 - 1.0 - 0.1 - 0.3 - 0.5) / 7)


def test_mixed_opd_adds_the_teacher_term_to_the_group_normalized_score():
    batch = _episodes()
    compute_agentic_targets(
        batch, _config(use_opd=True, teacher={"model_args": ROLE}, reward_normalization={"method": "mean"})
    )
    data = batch.batch
    mask = data["response_mask"].float()
    # grpo with method mean: g0 scores (1, 0) -> +-0.5; g1 alone -> 0
    rl = torch.tensor([0.5, -0.5, 0.0])[:, None] * mask
    expected = (rl - (data["old_log_probs"] - data["teacher_log_probs"])) * mask
    assert torch.allclose(data["advantages"], expected)


def test_each_teacher_scores_only_the_episodes_of_its_env_tags():
    batch = _episodes()
    data = batch.batch
    lake = torch.tensor([True, True, False])
    data["teacher_log_probs_lake"] = torch.where(lake[:, None], data["teacher_log_probs"], 0.0)
    data["teacher_rows_lake"] = lake
    data["teacher_log_probs_box"] = torch.where(~lake[:, None], data["teacher_log_probs"] - 1.0, 0.0)
    data["teacher_rows_box"] = ~lake
    teachers = {
        "lake": {"model_args": ROLE, "tag_included": ["Lake"]},
        "box": {"model_args": ROLE, "tag_included": ["Box"]},
    }
    metrics = compute_agentic_targets(batch, _config(is_pure_opd=True, teacher=teachers))
    mask = data["response_mask"].float()
    ratio = data["old_log_probs"] - data["teacher_log_probs"]
    expected = torch.where(lake[:, None], -ratio, -(ratio + 1.0)) * mask
    assert torch.allclose(data["advantages"], expected)
    assert metrics["opd/samples/lake"] == 2 and metrics["opd/samples/box"] == 1


# --- runs ---------------------------------------------------------------------------------------------------------
def _lake() -> dict[str, Any]:
    return {
        "env_type": "frozen_lake",
        "env_config": {"size": 3, "grid_vocab": {}, "env_instruction": "FrozenLake."},
        "max_steps": 2,
        "max_tokens_per_step": 8,
        "agent_system_template": None,
        "agent_template": "{observation}",
    }


def _run_data(out: Path, **extra: Any) -> dict[str, Any]:
    def role(name: str, strategy: str, model: str = NANO) -> dict[str, Any]:
        return {
            "name": name,
            "model_args": {"model_name_or_path": model, "dtype": "float32"},
            "strategy_args": {"strategy_name": strategy},
        }

    return {
        "pipeline_cls": "agentic",
        "output_dir": str(out),
        "max_steps": 2,
        "eval_steps": 2,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local"},
        "custom_envs": {"Lake": _lake(), "Lake2": _lake()},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake", "Lake2"]},
        "val_env_manager": {"num_env_groups": 4, "group_size": 1, "tags": ["Lake", "Lake2"]},
        "student_train": {**role("opd-student", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "student_infer": {**role("opd-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
        **extra,
    }


@pytest.mark.integration
@pytest.mark.parametrize("manager", ["traj", "step"])
def test_pure_opd_run_routes_episodes_by_env_tag_and_reports_kl_to_each_teacher(ray_env, tmp_path: Path, manager):
    """Trajectory-wise (an episode is a sample) and step-wise (each turn is a sample, the current grid its prompt)."""
    register_pipelines()
    teachers = {
        "a": {
            "name": "teacher-a",
            "model_args": {"model_name_or_path": "tiny://nano?seed=0", "dtype": "float32"},
            "strategy_args": {"strategy_name": "hf_infer"},
            "tag_included": ["Lake"],
        },
        "b": {
            "name": "teacher-b",
            "model_args": {"model_name_or_path": "tiny://nano?seed=2", "dtype": "float32"},
            "strategy_args": {"strategy_name": "hf_infer"},
            "tag_included": ["Lake2"],
            "opd_kl_coef": 0.5,
        },
    }
    data = _run_data(tmp_path, is_pure_opd=True, teacher=teachers)
    if manager == "step":
        turn = {"env_manager_cls": "step", "agent_template": "{current_observation}", "history_length": 0}
        data["custom_envs"] = {tag: {**spec, **turn} for tag, spec in data["custom_envs"].items()}
    run_config(load_config(data))
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for row in metrics[1:]:
        # every sample went to the teacher of its tag: 4 episodes, or each of their turns
        samples = row["opd/samples/a"] + row["opd/samples/b"]
        assert samples == 4 if manager == "traj" else samples == row["rollout/samples"] >= 4
        assert row["opd/reverse_kl/b"] != 0.0
        assert "actor/pg_loss" in row and row["rollout/samples"] == (4 if manager == "traj" else samples)
    before, after = metrics[0], metrics[2]
    # teacher a is the student's own model: before training the student's KL to it is 0 (up to float error), to the
    # other model b it is not
    assert before["val/kl_to_teacher/a"] == pytest.approx(0.0, abs=1e-5)
    assert abs(before["val/kl_to_teacher/b"]) > 1e-3
    assert abs(after["val/kl_to_teacher/a"]) > 1e-7  # two steps towards the teachers moved the student
    assert "val/success" in before and "val/kl_to_teacher" in after


@pytest.mark.pipeline_run
def test_dense_pure_opd_run_moves_the_student_towards_its_teacher(ray_env, tmp_path: Path):
    """Dense OPD (the teacher's whole next-token distribution at each sampled position): the student's KL to its
    teacher on the validation episodes falls within a few steps at a high learning rate."""
    register_pipelines()
    teacher = {
        "name": "teacher",
        "model_args": {"model_name_or_path": "tiny://nano?seed=1", "dtype": "float32"},
        "strategy_args": {"strategy_name": "hf_infer"},
    }
    data = _run_data(
        tmp_path, is_pure_opd=True, teacher=teacher, opd={"dense_objective": "forward_kl"}, max_steps=6, eval_steps=6
    )
    data["student_train"]["training_args"]["learning_rate"] = 3e-3
    run_config(load_config(data))
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    trained = [row for row in metrics if "actor/opd_dense_loss" in row]
    assert len(trained) == 6
    assert all(row["actor/pg_loss"] == 0 for row in trained)  # dense replaces the sampled-token advantage
    assert trained[-1]["actor/opd_dense_loss"] < trained[0]["actor/opd_dense_loss"]
    assert metrics[-1]["val/kl_to_teacher"] < metrics[0]["val/kl_to_teacher"]
