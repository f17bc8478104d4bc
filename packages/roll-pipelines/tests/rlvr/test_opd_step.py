"""Pure on-policy distillation end to end on one fixed batch, in process (no Ray): the rollout engine samples
(hf_infer), the teacher role scores the samples, the pipeline's training targets give the per-token advantage and
the actor takes one optimizer step (fsdp2_train, one rank).

Checked against hand-rolled transformers forwards on each unpadded row: the teacher's and the rollout's
log-probs sit on the sampled response tokens (same positions, no off-by-one, nothing on padding), the advantage
is ``-(log p_student - log p_teacher)`` on those tokens (no normalisation), and one step on it lowers the exact
reverse KL (over the whole vocabulary) to the teacher at the batch's positions; the opposite sign raises it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from roll.pipelines.data import PromptCollator
from roll.pipelines.rlvr.advantage import compute_training_targets
from roll.pipelines.rlvr.config import RLVRConfig
from roll.pipelines.rlvr.settings import PolicySettings
from roll.pipelines.rlvr.teacher_scoring import TeacherScoring
from roll.pipelines.rlvr.workers import ActorWorker, InferWorker, PolicyWorker
from roll.pipelines.stages import UpdatePlan, load_splits
from roll.pipelines.tokenizers import load_tokenizer
from roll.protocol import DataProto
from roll.strategies import GenerationConfig
from roll.strategies.generation import compact_generation_padding
from roll.strategies.testing import make_tiny_causal_lm

SAMPLES = 4
PROMPTS = 8


def _peaked(base: Path, out: Path, seed: int) -> Path:
    """``base`` with its matrices spread out (a fresh init is nearly uniform): distinct, confident models."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=generator) * 0.15)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("opd_step")
    base = make_tiny_causal_lm(root / "base", preset="nano", seed=0)
    return _peaked(base, root / "student", seed=1), _peaked(base, root / "teacher", seed=2)


def _config(student: Path, teacher: Path, learning_rate: float, **extra: Any) -> RLVRConfig:
    def role(path: Path, strategy: str, **extra: Any) -> dict[str, Any]:
        model = {"model_name_or_path": str(path), "dtype": "float32"}
        return {"world_size": 1, "model_args": model, "strategy_args": {"strategy_name": strategy}, **extra}

    return RLVRConfig.model_validate(
        {
            "pipeline_cls": "rlvr",
            "is_pure_opd": True,
            "rollout": {"batch_size": PROMPTS, "prompt_length": 48, "response_length": 12},
            "student_train": role(
                student,
                "fsdp2_train",
                training_args={"learning_rate": learning_rate, "per_device_train_batch_size": 64, "max_grad_norm": 1.0},
                data_args={
                    "file_name": "synthetic://arithmetic_prompts?n=16&seed=3&ops=add",
                    "extra_keys": ["ground_truth"],
                },
            ),
            "student_infer": role(
                student, "hf_infer", generating_args={"temperature": 1.0, "num_return_sequences": SAMPLES}
            ),
            "teacher": role(teacher, "hf_infer", opd_kl_coef=1.0),
            "rewards": {"math": {"reward_type": "math"}},
            **extra,
        }
    )


def _sampled_batch(config: RLVRConfig) -> DataProto:
    """The pipeline's rollout of one step: PROMPTS prompts x SAMPLES samples, unscored (pure OPD), compacted."""
    data_args = config.actor_train.require_data()
    data_args = data_args.model_copy(update={"max_prompt_length": config.rollout.prompt_length})
    tokenizer = load_tokenizer(config.actor_train.model_args)
    examples = load_splits(data_args, "prompt", tokenizer).train[:PROMPTS]
    prompts = PromptCollator(tokenizer.pad_token_id, config.rollout.prompt_length)(examples)
    infer = InferWorker(config.actor_infer)
    infer.initialize()
    generation = GenerationConfig(
        max_new_tokens=config.rollout.response_length,
        temperature=1.0,
        num_return_sequences=SAMPLES,
        seed=11,
        stop_token_ids=list(range(0, tokenizer.vocab_size, 16)),  # random models never say eos: stop some rows early
    )
    batch = infer.generate(prompts, generation)
    batch.batch["group_index"] = torch.arange(PROMPTS).repeat_interleave(SAMPLES)
    batch.batch["scores"] = torch.zeros(len(batch))
    return compact_generation_padding(batch)


def _rows(batch: DataProto) -> list[tuple[list[int], list[int]]]:
    """Each row's unpadded prompt and response token ids."""
    data = batch.batch
    width = data["prompts"].shape[1]
    prompt_mask = data["attention_mask"][:, :width].bool()
    return [
        (data["prompts"][i][prompt_mask[i]].tolist(), data["responses"][i][data["response_mask"][i].bool()].tolist())
        for i in range(len(batch))
    ]


@torch.no_grad()
def _hand_rolled(model: Any, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Per row, the (len(response), V) log-softmax predicting each response token, from one unpadded forward."""
    out = []
    for prompt, response in rows:
        logits = model(torch.tensor([prompt + response])).logits[0].float()
        out.append(torch.log_softmax(logits[len(prompt) - 1 : len(prompt) + len(response) - 1], dim=-1))
    return out


def _token_log_probs(full: list[torch.Tensor], rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    return [f.gather(-1, torch.tensor(r)[:, None])[:, 0] for f, (_, r) in zip(full, rows)]


def _exact_reverse_kl(student: list[torch.Tensor], teacher: list[torch.Tensor]) -> float:
    """Mean over the batch's response positions of KL(student || teacher) over the whole vocabulary."""
    per_token = torch.cat([(s.exp() * (s - t)).sum(-1) for s, t in zip(student, teacher)])
    return float(per_token.mean())


def _hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _exact_forward_kl(student: list[torch.Tensor], teacher: list[torch.Tensor]) -> float:
    """Mean over the batch's response positions of KL(teacher || student) over the whole vocabulary."""
    return _exact_reverse_kl(teacher, student)


def _train_once(config: RLVRConfig, batch: DataProto, student: Path) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """The actor's one OPD step on ``batch``: its new weights' log-softmax at the batch's positions, and its metrics."""
    actor = ActorWorker(config.actor_train)
    actor.initialize(config.actor_settings())
    result = actor.train_step(batch, UpdatePlan(num_mini_batches=1, epochs=1, seed=0), True)
    model = _hf(student)
    missing, unexpected = model.load_state_dict(dict(actor.strategy.named_weights()), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return _hand_rolled(model.eval(), _rows(batch)), result.meta_info["metrics"]


def _trained_reverse_kl(config: RLVRConfig, batch: DataProto, student: Path, teacher_full: list[torch.Tensor]) -> float:
    """The actor's one pure-OPD step on ``batch``; the exact reverse KL of its new weights at the batch's positions."""
    return _exact_reverse_kl(_train_once(config, batch, student)[0], teacher_full)


def test_one_pure_opd_step_aligns_teacher_tokens_and_lowers_the_reverse_kl(models: tuple[Path, Path]) -> None:
    student_path, teacher_path = models
    config = _config(student_path, teacher_path, learning_rate=1e-4)
    batch = _sampled_batch(config)
    rows = _rows(batch)
    mask = batch.batch["response_mask"].bool()
    assert all(len(r) > 0 for _, r in rows) and not bool(mask.all())  # some responses stop early: padding exists

    teacher_worker = PolicyWorker(config.teacher)
    teacher_worker.initialize(PolicySettings(temperature=1.0))
    scored = teacher_worker.compute_log_probs(batch)
    TeacherScoring.put(batch, {"teacher": torch.ones(len(batch), dtype=torch.bool)}, {"teacher:teacher": scored})
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]  # score_with_models, one on-policy update

    student_full, teacher_full = _hand_rolled(_hf(student_path), rows), _hand_rolled(_hf(teacher_path), rows)
    for i, (student_lp, teacher_lp) in enumerate(
        zip(_token_log_probs(student_full, rows), _token_log_probs(teacher_full, rows))
    ):
        n = len(rows[i][1])
        torch.testing.assert_close(batch.batch["teacher_log_probs"][i, :n], teacher_lp, atol=1e-4, rtol=0)
        torch.testing.assert_close(batch.batch["rollout_log_probs"][i, :n], student_lp, atol=1e-4, rtol=0)

    compute_training_targets(batch, config, 0.0)
    expected = -(batch.batch["old_log_probs"] - batch.batch["teacher_log_probs"]) * mask
    torch.testing.assert_close(batch.batch["advantages"], expected)
    assert float(batch.batch["advantages"][~mask].abs().sum()) == 0.0
    assert float(batch.batch["advantages"][mask].std()) > 0.1  # per-token values survive (no whitening to a constant)

    before = _exact_reverse_kl(student_full, teacher_full)
    after = _trained_reverse_kl(config, batch, student_path, teacher_full)
    assert after < before - 1e-3, (before, after)
    batch.batch["advantages"] = -batch.batch["advantages"]  # the opposite sign moves away from the teacher
    away = _trained_reverse_kl(config, batch, student_path, teacher_full)
    assert away > before + 1e-3, (before, away)
    print(f"exact reverse KL on the batch: {before:.4f} before, {after:.4f} after the step, {away:.4f} sign flipped")


def test_one_dense_opd_step_ships_the_teachers_distributions_and_lowers_the_forward_kl(
    models: tuple[Path, Path],
) -> None:
    """opd.dense_objective=forward_kl, the whole vocabulary (dense_topk 0), replacing the sampled-token advantage."""
    student_path, teacher_path = models
    config = _config(student_path, teacher_path, learning_rate=1e-4, opd={"dense_objective": "forward_kl"})
    batch = _sampled_batch(config)
    rows = _rows(batch)
    mask = batch.batch["response_mask"].bool()

    teacher_worker = PolicyWorker(config.teacher)
    teacher_worker.initialize(config.teacher_settings())
    scored = teacher_worker.compute_log_probs(batch)
    TeacherScoring.put(batch, {"teacher": torch.ones(len(batch), dtype=torch.bool)}, {"teacher:teacher": scored})
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
    assert "teacher_topk_indices" not in batch.batch.keys()  # the whole vocabulary: no ids travel
    student_full, teacher_full = _hand_rolled(_hf(student_path), rows), _hand_rolled(_hf(teacher_path), rows)
    shipped = batch.batch["teacher_topk_log_probs"]
    assert shipped.shape == (len(batch), mask.shape[1], teacher_full[0].shape[-1])
    for i, (_, response) in enumerate(rows):  # the teacher's distribution predicting each sampled token
        torch.testing.assert_close(shipped[i, : len(response)], teacher_full[i], atol=1e-4, rtol=0)

    compute_training_targets(batch, config, 0.0)
    assert float(batch.batch["advantages"].abs().sum()) == 0.0  # dense_mode replace: no sampled-token signal

    before = _exact_forward_kl(student_full, teacher_full)
    after_full, metrics = _train_once(config, batch, student_path)
    # the step's loss is the token-mean forward KL of the weights before it (one on-policy update)
    assert metrics["actor/opd_dense_loss"] == pytest.approx([before], rel=1e-3)  # one optimizer step
    after = _exact_forward_kl(after_full, teacher_full)
    assert after < before - 1e-3, (before, after)
    print(f"exact forward KL on the batch: {before:.4f} before, {after:.4f} after one dense OPD step")
