"""Several on-policy distillation teachers (ROLL's multi-teacher OPD): config, routing by tag, per-row advantages."""

from __future__ import annotations

import pytest
import torch

from roll.pipelines.algorithms import grpo_advantages
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.opd import kl_metrics
from roll.pipelines.rlvr.teacher_routing import TeacherRouter, teachers_by_domain
from roll.protocol import DataProto

ROLE = {"model_args": {"model_name_or_path": "tiny://nano"}, "strategy_args": {"strategy_name": "mock_infer"}}
DATA = {"file_name": "synthetic://arithmetic_prompts?n=8"}
REWARDS = {
    "math": {"reward_type": "math", "tag_included": ["math_dapo", "gsm"]},
    "code": {"reward_type": "math", "tag_included": ["KodCode"]},
    "chat": {"reward_type": "math", "tag_included": ["chat"]},
}
TAGS = ["math_dapo", "KodCode", "gsm", "chat", "KodCode", "math_dapo"]


def make_config(teacher: dict, rewards: dict = REWARDS, **overrides) -> RLVRConfig:
    data = {
        "pipeline_cls": "rlvr",
        "actor_train": {**ROLE, "data_args": DATA},
        "actor_infer": {**ROLE, "generating_args": {"num_return_sequences": 2}},
        "rewards": rewards,
        "teacher": teacher,
        **overrides,
    }
    return RLVRConfig.model_validate(data)


def teacher(coef: float = 1.0, tags: list[str] | None = None) -> dict:
    return {**ROLE, "opd_kl_coef": coef, "tag_included": tags or []}


def test_roll_teacher_dict_becomes_teachers_with_their_own_roles():
    config = make_config({"t_math": teacher(tags=["math_dapo"]), "t_code": teacher(2.0, ["KodCode"])}, use_opd=True)
    assert config.teacher is None and config.teachers is not None
    assert list(config.teacher_roles()) == ["t_math", "t_code"]
    assert config.teachers["t_code"].opd_kl_coef == 2.0 and config.teachers["t_code"].tag_included == ["KodCode"]
    # each teacher is a role with its own name (its own cluster)
    assert {"teachers.t_math", "teachers.t_code"} <= set(config.roles())
    assert config.teachers["t_math"].name == "teachers_t_math"
    # one teacher stays one role named teacher
    single = make_config(teacher(), use_opd=True)
    assert single.teachers is None and list(single.teacher_roles()) == ["teacher"]


def test_routing_on_a_mixed_batch_follows_the_domains_tags():
    config = make_config(
        {"t_math": teacher(tags=["math_dapo"]), "t_code": teacher(tags=["KodCode"]), "t_all": teacher()},
        is_pure_opd=True,
    )
    domain_tags = {d: r.tag_included for d, r in config.rewards.items()}
    teacher_tags = {n: t.tag_included for n, t in config.teacher_roles().items()}
    assert teachers_by_domain(domain_tags, teacher_tags) == {
        "math": ["t_math", "t_all"],
        "code": ["t_code", "t_all"],
        "chat": ["t_all"],
    }
    masks = TeacherRouter(domain_tags, teacher_tags, pure=True).masks(TAGS)
    # "gsm" is not t_math's tag, but its domain (math) has math_dapo: ROLL routes by the row's domain
    assert masks["t_math"].nonzero().flatten().tolist() == [0, 2, 5]
    assert masks["t_code"].nonzero().flatten().tolist() == [1, 4]
    assert masks["t_all"].all()


def test_routing_errors_name_the_domain_tag_and_teachers():
    two = {"t_math": teacher(tags=["math_dapo"]), "t_code": teacher(tags=["KodCode"])}
    with pytest.raises(ValueError, match=r"\['chat'\].*tags \[\['chat'\]\].*t_math: \['math_dapo'\]"):
        make_config(two, is_pure_opd=True)  # pure OPD: chat rows would get no advantage at all
    mixed = make_config(two, use_opd=True)  # mixed OPD: chat rows keep their reward advantage (as ROLL)
    assert mixed.teachers is not None
    with pytest.raises(ValueError, match=r"teacher 't_code': tag_included names \['code'\]"):
        make_config({"t_math": teacher(tags=["math_dapo"]), "t_code": teacher(tags=["code"])}, use_opd=True)
    router = TeacherRouter({"math": ["math_dapo"], "chat": ["chat"]}, {"t_math": ["math_dapo"]}, pure=True)
    with pytest.raises(ValueError, match=r"row 1 \(tag 'chat', reward domain 'chat'\) is routed to no teacher"):
        router.masks(["math_dapo", "chat"])
    with pytest.raises(ValueError, match="teacher .* and teachers .* both set"):
        make_config(teacher(), use_opd=True, teachers={"t": teacher()})


STUDENT = torch.tensor(
    [[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5], [-2.0, -1.0, -0.1], [-0.3, -4.0, -1.0], [-1.5, -0.2, -0.7]]
)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
T_A = torch.tensor([[-0.5, -2.5, -9.0], [0, 0, 0], [-1.0, -3.0, -0.2], [0, 0, 0], [-1.0, -0.4, 0.0]])
T_B = torch.tensor([[0, 0, 0], [-0.5, -1.5, 0.0], [0, 0, 0], [-1.3, -2.0, -0.5], [-2.5, -0.1, 0.0]])
ROWS_A = torch.tensor([True, False, True, False, True])
ROWS_B = torch.tensor([False, True, False, True, True])  # row 4 goes to both


def two_teacher_batch() -> DataProto:
    return DataProto.from_dict(
        {
            "response_mask": MASK,
            "scores": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]),
            "group_index": torch.tensor([0, 0, 1, 1, 2]),
            "old_log_probs": STUDENT,
            "teacher_log_probs_a": T_A,
            "teacher_rows_a": ROWS_A,
            "teacher_log_probs_b": T_B,
            "teacher_rows_b": ROWS_B,
        },
        {"finish_reason": ["stop"] * 5, "tag": ["x"] * 5},
    )


def reference_opd(coefs: dict[str, float]) -> torch.Tensor:
    """Plain-Python per row: the sum over the row's teachers of -coef * (log p_student - log p_teacher) (k1)."""
    out = torch.zeros(5, 3)
    for row in range(5):
        for name, teacher_lp, rows in (("a", T_A, ROWS_A), ("b", T_B, ROWS_B)):
            if not rows[row]:
                continue
            for tok in range(3):
                if MASK[row, tok]:
                    out[row, tok] += -coefs[name] * (float(STUDENT[row, tok]) - float(teacher_lp[row, tok]))
    return out


def test_pure_opd_advantage_per_row_is_the_single_teacher_formula_of_its_teacher():
    rewards = {"x": {"reward_type": "math"}}
    config = make_config({"a": teacher(2.0), "b": teacher(0.5)}, rewards=rewards, is_pure_opd=True)
    data = two_teacher_batch()
    metrics = compute_training_targets(data, config, 0.0)
    expected = reference_opd({"a": 2.0, "b": 0.5})
    torch.testing.assert_close(data.batch["advantages"], expected, atol=1e-6, rtol=0)
    # rows with one teacher: exactly the single-teacher OPD of that teacher
    single = make_config(teacher(2.0), rewards=rewards, is_pure_opd=True)
    one = DataProto.from_dict(
        {
            "response_mask": MASK,
            "scores": torch.zeros(5),
            "group_index": torch.arange(5),
            "old_log_probs": STUDENT,
            "teacher_log_probs": T_A,
        },
        {"finish_reason": ["stop"] * 5},
    )
    compute_training_targets(one, single, 0.0)
    for row in (0, 2):
        torch.testing.assert_close(data.batch["advantages"][row], one.batch["advantages"][row], atol=1e-6, rtol=0)
    assert metrics["opd/samples/a"] == 3 and metrics["opd/samples/b"] == 3
    kl_a = [(STUDENT - T_A)[r, t] for r in (0, 2, 4) for t in range(3) if MASK[r, t]]
    assert metrics["opd/reverse_kl/a"] == pytest.approx(float(sum(kl_a) / len(kl_a)), abs=1e-6)


def test_per_domain_stats_keep_each_teachers_metrics_on_its_own_rows():
    # a ROLL file (advantage.domain_stats) with one teacher per domain: each domain's targets are computed apart,
    # and a teacher's metrics must describe its rows only, not be averaged with the domain it got no row of
    rewards = {
        "math": {"reward_type": "math", "tag_included": ["m"]},
        "code": {"reward_type": "math", "tag_included": ["c"]},
    }
    config = make_config(
        {"a": teacher(tags=["m"]), "b": teacher(tags=["c"])},
        rewards=rewards,
        is_pure_opd=True,
        advantage={"domain_stats": True},
    )
    data = two_teacher_batch()
    data.non_tensor_batch["tag"] = ["m", "c", "m", "c", "m"]
    data.batch["teacher_rows_b"] = ~ROWS_A  # a: the math rows 0, 2, 4; b: the code rows 1, 3
    metrics = compute_training_targets(data, config, 0.0)
    assert metrics["opd/samples/a"] == 3 and metrics["opd/samples/b"] == 2  # counts add up over domains
    assert metrics["opd/samples/a/math"] == 3 and metrics["opd/samples/a/code"] == 0
    for name, teacher_lp, rows in (("a", T_A, (0, 2, 4)), ("b", T_B, (1, 3))):
        kl = [float((STUDENT - teacher_lp)[r, t]) for r in rows for t in range(3) if MASK[r, t]]
        assert metrics[f"opd/reverse_kl/{name}"] == pytest.approx(sum(kl) / len(kl), abs=1e-6)
    assert metrics["opd/reverse_kl/a/math"] == pytest.approx(metrics["opd/reverse_kl/a"], abs=1e-6)
    # no KL for a teacher in the domain it scored nothing of (0.0 would read as "matches the teacher")
    assert "opd/reverse_kl/a/code" not in metrics and "opd/reverse_kl/b/math" not in metrics


def test_kl_metrics_leave_out_a_teacher_without_tokens():
    assert kl_metrics({"a": (3.0, 4.0), "b": (0.0, 0.0)}, "val/kl_to_teacher") == {
        "val/kl_to_teacher/a": 0.75,
        "val/kl_to_teacher": 0.75,
    }
    assert kl_metrics({"teacher": (1.0, 2.0)}, "opd/reverse_kl") == {"opd/reverse_kl": 0.5}


def test_mixed_opd_adds_each_rows_teacher_terms_to_the_reward_advantage():
    rewards = {"x": {"reward_type": "math"}}
    config = make_config({"a": teacher(1.0), "b": teacher(3.0)}, rewards=rewards, use_opd=True)
    data = two_teacher_batch()
    data.batch["teacher_rows_b"] = torch.tensor([False, True, False, False, False])  # rows 3: no teacher
    compute_training_targets(data, config, 0.0)
    grpo, _ = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), MASK.float(), torch.tensor([0, 0, 1, 1, 2]))
    expected = grpo.clone()
    for row in range(5):
        for coef, teacher_lp, rows in ((1.0, T_A, ROWS_A), (3.0, T_B, data.batch["teacher_rows_b"])):
            if rows[row]:
                expected[row] += -coef * (STUDENT[row] - teacher_lp[row]) * MASK[row]
    torch.testing.assert_close(data.batch["advantages"], expected * MASK, atol=1e-6, rtol=0)
    torch.testing.assert_close(data.batch["advantages"][3], grpo[3] * MASK[3], atol=1e-6, rtol=0)


def test_one_teacher_with_tag_included_is_routed_too():
    config = make_config(teacher(tags=["KodCode"]), use_opd=True)  # mixed: math and chat rows keep their reward
    assert list(config.teacher_roles()) == ["teacher"]
    roles = config.teacher_roles()
    router = TeacherRouter(
        {d: r.tag_included for d, r in config.rewards.items()},
        {n: t.tag_included for n, t in roles.items()},
        pure=False,
    )
    assert router.masks(TAGS)["teacher"].nonzero().flatten().tolist() == [1, 4]
    with pytest.raises(ValueError, match=r"\['math', 'chat'\]"):
        make_config(teacher(tags=["KodCode"]), is_pure_opd=True)
