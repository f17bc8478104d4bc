"""Pure on-policy distillation with two tiny teachers routed by tag: a short RLVR run on one private local Ray.

The data mixes two tags (``add``, ``sub``), each its own reward domain; teacher ``t_sub`` is the student's own
initial model (so its KL on the first step's samples, and on held-out samples before training, is ~0) and
``t_add`` another model (clearly non-zero KL).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

STUDENT = "tiny://nano?seed=0"


def _data(path: Path, start: int = 0) -> str:
    rows = []
    for i in range(start, start + 32):
        a, b = 10 + i, 3 + i % 7
        rows.append({"prompt": f"What is {a} + {b}?", "ground_truth": str(a + b), "tag": "add"})
        rows.append({"prompt": f"What is {a} - {b}?", "ground_truth": str(a - b), "tag": "sub"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _role(model: str, strategy: str, name: str, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "world_size": 1,
        "model_args": {"model_name_or_path": model, "dtype": "float32"},
        "strategy_args": {"strategy_name": strategy},
        **extra,
    }


@pytest.mark.pipeline_run
def test_two_teachers_each_score_their_own_domain(tmp_path: Path, ray_env: None) -> None:
    data = {
        "pipeline_cls": "rlvr",
        "exp_name": "opd-two-teachers",
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "eval_steps": 0,
        "save_steps": 0,
        "export_hf": False,
        "validation": {"batch_size": 64},
        "plots": False,
        "is_pure_opd": True,
        "opd": {"score_rollouts": True},  # ROLL's: the rewards score training rollouts too, for the metrics only
        "rollout": {
            "batch_size": 4,
            "prompt_length": 48,
            "response_length": 8,
            "domain_interleave_probs": {"add": 0.5, "sub": 0.5},
        },
        "student_train": _role(
            STUDENT,
            "fsdp2_train",
            "mt-train",
            training_args={"per_device_train_batch_size": 8, "learning_rate": 1e-3},
            data_args={
                "file_name": _data(tmp_path / "mixed.jsonl"),
                "eval_file_name": _data(tmp_path / "eval.jsonl", start=100),
                "extra_keys": ["ground_truth"],
            },
        ),
        "student_infer": _role(STUDENT, "hf_infer", "mt-infer", generating_args={"num_return_sequences": 2}),
        "teacher": {
            "t_add": _role("tiny://nano?seed=7", "hf_infer", "mt-t-add", tag_included=["add"], opd_kl_coef=1.0),
            "t_sub": _role(STUDENT, "hf_infer", "mt-t-sub", tag_included=["sub"], opd_kl_coef=0.5),
        },
        "rewards": {
            "add": {"reward_type": "math", "world_size": 1, "name": "mt-r-add"},
            "sub": {"reward_type": "math", "world_size": 1, "name": "mt-r-sub"},
        },
    }
    config = load_config(data)
    assert sorted(config.teacher_roles()) == ["t_add", "t_sub"]  # type: ignore[attr-defined]
    run_config(config)
    metrics = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [m["step"] for m in metrics if "opd/reverse_kl" in m] == [1, 2]
    for m in metrics[1:]:
        # 2 prompts per domain x 2 samples each: every row to its own domain's teacher, none to the other
        assert m["opd/samples/t_add"] == 4 and m["opd/samples/t_sub"] == 4
        assert {"rollout/score/add", "rollout/score/sub", "rollout/correct"} <= set(m)  # scored, for the metrics
    first = metrics[1]
    # t_sub is the student's initial model: on the first step's samples its KL is ~0; t_add is another model
    assert first["opd/reverse_kl/t_sub"] == pytest.approx(0.0, abs=1e-3)
    assert abs(first["opd/reverse_kl/t_add"]) > 0.05
    low, high = sorted((first["opd/reverse_kl/t_add"], first["opd/reverse_kl/t_sub"]))
    assert low <= first["opd/reverse_kl"] <= high  # the token-weighted mean over both teachers' rows
    assert metrics[-1]["actor/grad_norm"] > 0
    # held-out: the same per-teacher KL on the student's validation samples (before training: t_sub ~0)
    assert metrics[0]["val/kl_to_teacher/t_sub"] == pytest.approx(0.0, abs=1e-3)
    assert abs(metrics[0]["val/kl_to_teacher/t_add"]) > 0.05
    assert "val/kl_to_teacher/t_add" in metrics[-1] and "val/correct/add" in metrics[-1]
