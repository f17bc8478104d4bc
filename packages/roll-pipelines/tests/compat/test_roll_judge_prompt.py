"""ROLL's judge_prompt in the translator: every LLM-judge domain gets reward_kwargs.prompt_style ROLL/<name>
(ROLL's template and yes/no reading), ROLL/default without one or with a name ROLL's table lacks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.pipelines.compat import compose_file, translate

ROLL_FILE = """
pretrain: /m/policy
rollout_batch_size: 2
num_return_sequences_in_group: 2
prompt_length: 64
response_length: 16
adv_estimator: grpo
actor_train:
  data_args: {template: native, file_name: [data/train.jsonl]}
  strategy_args: {strategy_name: fsdp2_train}
  device_mapping: list(range(0,1))
actor_infer:
  strategy_args: {strategy_name: hf_infer}
  device_mapping: list(range(0,1))
rewards:
  math_rule:
    worker_cls: roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker
    judge_prompt: Qwen2.5-7B-Instruct-RLVR-prompt
    tag_included: [math]
  llm_judge:
    worker_cls: roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker
    judge_model_type: inference
    tag_included: [RLVR]
    model_args: {model_name_or_path: /m/judge}
    strategy_args: {strategy_name: hf_infer}
    generating_args: {max_new_tokens: 8, do_sample: false}
    device_mapping: list(range(1,2))
"""
TARGET = "rewards.llm_judge.reward_kwargs.prompt_style"


def _translate(judge_prompt: Any = None, **kwargs: Any) -> Any:
    data = yaml.safe_load(ROLL_FILE)
    domain = data["rewards"]["llm_judge"]
    if judge_prompt is not None:
        domain["judge_prompt"] = judge_prompt
    if kwargs:
        domain["reward_kwargs"] = kwargs
    return translate(data)


def _row(translation: Any, key: str) -> tuple[str, str, str]:
    (row,) = [row for row in translation.rows if row.key == key]
    return row.status, row.target, row.note


@pytest.mark.parametrize(
    ("judge_prompt", "key", "style", "note"),
    [
        (
            "Qwen2.5-7B-Instruct-RLVR-prompt",
            "",
            "ROLL/Qwen2.5-7B-Instruct-RLVR-prompt",
            "scores 1 if it contains 'yes'",
        ),
        (None, "(rewards.llm_judge.judge_prompt)", "ROLL/default", "judge_prompt unset"),
        ("my-prompt", "", "ROLL/default", "'my-prompt' is not in ROLL's prompt table"),
        ("default", "", "ROLL/default", "'default' is not in ROLL's prompt table"),
    ],
)
def test_judge_prompt_becomes_a_prompt_style(judge_prompt: str | None, key: str, style: str, note: str) -> None:
    translation = _translate(judge_prompt)
    assert translation.problems == []
    judge = translation.data["rewards"]["llm_judge"]
    assert judge["reward_kwargs"] == {"max_new_tokens": 8, "temperature": 0.0, "prompt_style": style}
    assert "judge_prompt" not in judge
    status, target, text = _row(translation, key or "rewards.llm_judge.judge_prompt")
    assert (status, target) == ("implemented-as", TARGET) and note in text


def test_a_given_prompt_style_wins_and_other_domains_ignore_judge_prompt() -> None:
    translation = _translate("Qwen2.5-7B-Instruct-RLVR-prompt", prompt_style="roll")
    assert translation.data["rewards"]["llm_judge"]["reward_kwargs"]["prompt_style"] == "roll"
    status, _, note = _row(translation, "rewards.llm_judge.judge_prompt")
    assert status == "ignored" and "is given and wins" in note
    status, _, note = _row(translation, "rewards.math_rule.judge_prompt")
    assert status == "ignored" and "ROLL's LLM judge only" in note
    assert "judge_prompt" not in translation.data["rewards"]["math_rule"].get("reward_kwargs", {})


ROOT = os.environ.get("ROLL_EXAMPLES_DIR")


def _judge_files() -> list[Path]:
    if not ROOT:
        return []
    return sorted(p for p in Path(ROOT).rglob("*.yaml") if "LLMJudgeRewardWorker" in p.read_text(errors="replace"))


@pytest.mark.skipif(not ROOT, reason="ROLL_EXAMPLES_DIR is not set")
def test_every_roll_example_judge_gets_its_prompt_style() -> None:
    checked = []
    for path in _judge_files():
        try:
            data, referenced = compose_file(path)
        except Exception:  # unusable files are test_roll_examples' business
            continue
        judges = {
            name: domain
            for name, domain in (data.get("rewards") or {}).items()
            if str(domain.get("worker_cls", "")).endswith("LLMJudgeRewardWorker")
        }
        translation = translate(data, referenced)
        for name, domain in judges.items():
            style = translation.data["rewards"][name]["reward_kwargs"]["prompt_style"]
            given = domain.get("judge_prompt")
            assert style == (f"ROLL/{given}" if given else "ROLL/default"), (path, name)
            key = f"rewards.{name}.judge_prompt" if given else f"(rewards.{name}.judge_prompt)"
            assert _row(translation, key)[:2] == ("implemented-as", f"rewards.{name}.reward_kwargs.prompt_style")
            checked.append(f"{path.relative_to(ROOT)}:{name}")
    names = {item.split(":")[0] for item in checked}
    assert {
        "qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus_llm_as_judge.yaml",
        "qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus_llm_as_judge_server.yaml",
    } <= names
    assert len(checked) >= 20, checked
