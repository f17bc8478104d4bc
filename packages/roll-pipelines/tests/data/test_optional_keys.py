"""``data_args.optional_keys``: columns only some rows have (multi-domain RL data, as ROLL's files mix code rows with
tests and math rows without), carried as None where absent; a reward domain that needs one still fails at load."""

from __future__ import annotations

from typing import Any

import pytest

from roll.pipelines.data import DataArgs, PromptCollator, encode_prompt
from roll.pipelines.rewards import resolve_reward_worker
from roll.pipelines.rlvr.rollout import check_reward_fields
from roll.pipelines.rlvr.sections import RewardConfig
from roll.runtime import ConfigError

MATH = {"prompt": "1 + 1?", "tag": "math", "ground_truth": "2"}
CODE = {"prompt": "Add.", "tag": "code", "ground_truth": "", "test_cases": [{"stdin": "1 1", "expected_stdout": "2"}]}


def args(**overrides: Any) -> DataArgs:
    return DataArgs(file_name="rl.jsonl", extra_keys=["ground_truth"], **overrides)


def test_rows_without_an_optional_column_carry_none_and_batch_with_the_others(tokenizer) -> None:
    data = args(optional_keys=["test_cases", "case_type"], domain_key="domain")
    encoded = [encode_prompt(row, tokenizer, data) for row in (MATH, CODE)]
    assert encoded[0]["test_cases"] is None and encoded[1]["test_cases"] == CODE["test_cases"]
    assert encoded[0]["case_type"] is None and encoded[0]["domain"] is None  # the same fields in every prompt
    batch = PromptCollator(0, 64)(encoded)
    assert batch.non_tensor_batch["test_cases"][0] is None and batch.non_tensor_batch["domain"].tolist() == [None, None]


def test_a_domain_still_needs_its_column_in_each_of_its_rows(tokenizer) -> None:
    data = args(optional_keys=["test_cases"])
    rewards = {"math": RewardConfig(reward_type="math", tag_included=["math"]),
               "code": RewardConfig(reward_type="code", tag_included=["code"])}  # fmt: skip
    workers = {name: resolve_reward_worker(cfg.reward_type) for name, cfg in rewards.items()}
    examples = [encode_prompt(row, tokenizer, data) for row in (MATH, CODE)]
    check_reward_fields(examples, rewards, workers)  # math rows need no tests, code rows have them
    examples.append(encode_prompt({**CODE, "test_cases": None}, tokenizer, data))
    with pytest.raises(ConfigError, match=r"reward domain 'code' \(code\) needs a 'test_cases or tests' field, "
                       r"but prompt 2 has only \['ground_truth', 'prompt', 'prompt_ids', 'tag'\]; .*optional_keys"):  # fmt: skip
        check_reward_fields(examples, rewards, workers)


def test_a_column_is_required_or_optional_not_both() -> None:
    with pytest.raises(ConfigError, match=r"\['ground_truth'\] are in both extra_keys \(required\) and optional_keys"):
        args(optional_keys=["ground_truth"])
    with pytest.raises(ConfigError, match="optional_keys .* clash with columns the data pipeline creates"):
        args(optional_keys=["prompt"])


def test_validate_reads_the_optional_columns_as_the_run_does(tmp_path, capsys) -> None:
    """roll validate's reward-field check builds the prompts' fields as encode_prompt does (it had its own copy,
    which left optional_keys out and refused every code row)."""
    import json

    from roll.pipelines.cli import main

    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in (MATH, CODE)) + "\n")
    overrides = [
        f"actor_infer.data_args.file_name={data}",
        "actor_infer.data_args.eval_file_name=null",
        "actor_infer.data_args.optional_keys=[test_cases]",
        "rewards={math: {reward_type: math, tag_included: [math]}, code: {reward_type: code, tag_included: [code]}}",
    ]
    code = main(["validate", "--no-ray", "rlvr-rollout-tiny", *overrides])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "prompts checked for their fields (2 train)" in out
