"""ROLL's LLM-judge reward domains: sampling settings to reward_kwargs, and the judge server (judge_model_type:
cluster + a top-level reward_model role) folded into the judge domain, run on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.protocol import DataProto

SERVER = """
hydra: {run: {dir: .}}
exp_name: judge_server
pretrain: POLICY
rollout_batch_size: 2
num_return_sequences_in_group: 2
prompt_length: 64
response_length: 16
adv_estimator: grpo
actor_train:
  model_args: {dtype: fp32}
  data_args: {template: native, file_name: [data/train.jsonl]}
  strategy_args: {strategy_name: fsdp2_train}
  device_mapping: list(range(0,2))
actor_infer:
  model_args: {dtype: fp32}
  strategy_args: {strategy_name: hf_infer}
  device_mapping: list(range(0,2))
rewards:
  llm_judge:
    worker_cls: roll.pipeline.rlvr.rewards.llm_judge_reward_worker.LLMJudgeRewardWorker
    judge_model_type: cluster
    judge_prompt: Qwen2.5-7B-Instruct-RLVR-prompt
    tag_included: [RLVR]
    world_size: 32
    model_args: {model_name_or_path: "${pretrain}"}
    generating_args: {max_new_tokens: 7, temperature: 0.3, top_p: 0.9, num_return_sequences: 1}
    data_args: {template: native}
reward_model:
  name: reward_llm
  worker_cls: roll.pipeline.base_worker.InferWorker
  model_args: {model_name_or_path: JUDGE, dtype: fp32}
  generating_args: {max_new_tokens: 512, temperature: 0.3}
  data_args: {template: native}
  strategy_args: {strategy_name: hf_infer, strategy_config: {device: cpu}}
  device_mapping: "[2, 3]"
"""


def _data(tmp_path: Path, text: str, **replace: str) -> tuple[dict[str, Any], set[str]]:
    for key, value in replace.items():
        text = text.replace(key, value)
    path = tmp_path / "roll.yaml"
    path.write_text(text)
    return compose_file(path)


def _rows(translation: Any) -> dict[str, tuple[str, str]]:
    return {row.key: (row.status, row.target) for row in translation.rows}


def test_judge_server_folds_into_the_judge_domain(tmp_path: Path) -> None:
    translation = translate(*_data(tmp_path, SERVER, POLICY="/m/policy", JUDGE="/m/judge"))
    assert translation.problems == []
    judge = translation.data["rewards"]["llm_judge"]
    assert "reward_model" not in translation.data
    # The served model, its backend and its devices; the sampling settings of the domain (ROLL's client sends them).
    assert judge["model_args"] == {"model_name_or_path": "/m/judge", "dtype": "float32"}
    assert judge["strategy_args"]["strategy_name"] == "hf_infer"
    assert judge["device_mapping"] == "[2, 3]"
    # top_k: ROLL's GeneratingArguments default (50), which ROLL's judge sends too
    assert judge["reward_kwargs"] == {
        "max_new_tokens": 7,
        "temperature": 0.3,
        "generation": {"top_p": 0.9, "top_k": 50},
        "prompt_style": "ROLL/Qwen2.5-7B-Instruct-RLVR-prompt",  # ROLL's template and yes/no reading
    }
    assert not {"world_size", "generating_args", "judge_model_type", "judge_prompt"} & set(judge)
    rows = _rows(translation)
    assert rows["rewards.llm_judge.judge_prompt"] == ("implemented-as", "rewards.llm_judge.reward_kwargs.prompt_style")
    assert rows["rewards.llm_judge.judge_model_type"] == ("implemented-as", "rewards.llm_judge")
    assert rows["rewards.llm_judge.world_size"][0] == "ignored"
    assert rows["reward_model.generating_args"][0] == "ignored"
    assert rows["reward_model.device_mapping"] == ("renamed", "rewards.llm_judge.device_mapping")
    assert rows["rewards.llm_judge.generating_args.max_new_tokens"] == (
        "renamed",
        "rewards.llm_judge.reward_kwargs.max_new_tokens",
    )


def test_cluster_mode_needs_a_server_and_one_domain(tmp_path: Path) -> None:
    no_server = yaml.safe_load(SERVER.replace("${pretrain}", "/m/policy"))
    del no_server["reward_model"]
    problems = {row.key: row.note for row in translate(no_server).problems}
    assert list(problems) == ["rewards.llm_judge.judge_model_type"]
    assert "needs a top-level reward_model" in problems["rewards.llm_judge.judge_model_type"]

    two = yaml.safe_load(SERVER.replace("${pretrain}", "/m/policy"))
    two["rewards"]["judge2"] = dict(two["rewards"]["llm_judge"])
    problems = {row.key: row.note for row in translate(two).problems}
    assert list(problems) == ["reward_model"] and "share one judge cluster" in problems["reward_model"]


def test_unused_server_is_ignored_and_inference_judges_take_their_sampling(tmp_path: Path) -> None:
    data = yaml.safe_load(SERVER.replace("${pretrain}", "/m/policy"))
    domain = data["rewards"]["llm_judge"]
    domain["judge_model_type"] = "inference"
    domain["generating_args"] = {"max_new_tokens": 9, "do_sample": False, "max_length": 100}
    del domain["world_size"], domain["judge_prompt"]
    translation = translate(data)
    assert translation.problems == []
    assert "reward_model" not in translation.data
    assert _rows(translation)["reward_model"][0] == "ignored"
    judge = translation.data["rewards"]["llm_judge"]
    # greedy: no top_p / top_k
    assert judge["reward_kwargs"] == {"max_new_tokens": 9, "temperature": 0.0, "prompt_style": "ROLL/default"}
    assert _rows(translation)["rewards.llm_judge.generating_args.max_length"][0] == "ignored"
    domain["generating_args"] = {"temperature": 0.5}
    kwargs = translate(data).data["rewards"]["llm_judge"]["reward_kwargs"]
    assert kwargs == {
        "temperature": 0.5,
        "max_new_tokens": 8192,
        "generation": {"top_p": 0.7, "top_k": 50},
        "prompt_style": "ROLL/default",
    }
    assert judge["model_args"]["model_name_or_path"] == "/m/policy"  # inference mode: the domain's own model


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from roll.strategies.testing import make_tiny_causal_lm

    root = tmp_path_factory.mktemp("judge_server")
    return make_tiny_causal_lm(root / "policy", preset="nano"), make_tiny_causal_lm(root / "judge", preset="nano")


def test_judge_server_file_scores_with_the_served_tiny_model(tmp_path: Path, tiny_models: tuple[Path, Path]) -> None:
    """The loaded judge domain builds roll's llm_judge worker on the served model with the domain's sampling."""
    from roll.pipelines.rewards.llm_judge import LLMJudgeRewardWorker

    policy, judge_model = tiny_models
    path = tmp_path / "roll.yaml"
    path.write_text(SERVER.replace("POLICY", str(policy)).replace("JUDGE", str(judge_model)))
    config = load_config(path)
    role = config.rewards["llm_judge"]
    assert role.model_args.model_name_or_path == str(judge_model)
    worker = LLMJudgeRewardWorker(role)
    worker.initialize(None)
    assert worker.generation_config is not None
    assert (worker.generation_config.max_new_tokens, worker.generation_config.temperature) == (7, 0.3)
    assert worker.generation_config.top_p == 0.9
    assert worker.roll_template is not None and "**Solution Process (Final Step Only):**" in worker.roll_template
    rows = DataProto.from_dict(
        {"response_mask": torch.ones(2, 3, dtype=torch.long)},
        {"prompt": ["1 + 1?", "2 + 2?"], "response_text": ["2", "5"], "ground_truth": ["2", "4"], "tag": ["RLVR"] * 2},
    )
    out = worker.compute_rewards(rows)
    scores = out["scores"]
    assert scores.shape == (2,) and bool(((scores >= 0) & (scores <= 1)).all())
    for score, reason in zip(scores.tolist(), out["reward_info"].tolist()):  # a random model cannot judge
        assert reason.startswith(("judge yes", "judge no", "unparseable judge output")), reason
        assert score == (1.0 if reason.startswith("judge yes") else 0.0)  # ROLL's yes/no rule
