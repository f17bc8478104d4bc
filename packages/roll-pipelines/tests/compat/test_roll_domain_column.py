"""ROLL's RLVR rows may name their reward domain in a ``domain`` column, which routes them before their tag (ROLL's
``update_dataset_domain``): its own data/math_benchmarks.jsonl holds tags MATH-500/aime2024/aime2025 with domain
math_rule, used as validation data by files whose math_rule domain lists other tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.pipelines.cli import main
from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.pipelines.rlvr.rollout import route_domain_column, split_by_domain
from roll.pipelines.rlvr.sections import RewardConfig
from roll.runtime import ConfigError

TINY = Path(__file__).parent / "fixtures" / "tiny" / "rlvr_tiny.yaml"

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def _benchmark_row(i: int, tag: str) -> dict:
    """A row of ROLL's data/math_benchmarks.jsonl (its columns, synthetic content)."""
    prompt = f"What is {i} + {i}?"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    return {
        "id": str(i),
        "domain": "math_rule",
        "source": tag,
        "difficulty": 0.0,
        "prompt": prompt,
        "messages": json.dumps(messages),
        "ground_truth": str(2 * i),
        "case_type": "",
        "test_case_function": "",
        "test_cases": "",
        "tag": tag,
    }


def test_a_roll_rlvr_file_routes_rows_by_their_domain_column(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    data_file = tmp_path / "math_benchmarks.jsonl"
    rows = [_benchmark_row(i, tag) for i, tag in enumerate(["aime2024", "MATH-500", "aime2025", "MATH-500"])]
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data, referenced = compose_file(TINY)
    data["validation"] = {"data_args": {"file_name": [str(data_file)]}}
    row = {row.key: row for row in translate(data, referenced).rows}["(actor_train.data_args.domain_key)"]
    assert (row.status, row.target) == ("implemented-as", "actor_train.data_args.domain_key")
    config = load_config(data)
    assert config.actor_train.data_args is not None and config.actor_train.data_args.domain_key == "domain"

    path = tmp_path / "rlvr.yaml"
    path.write_text(
        TINY.read_text().replace(
            "defaults:\n  - base/common@_here_", f"defaults:\n  - {TINY.parent}/base/common@_here_"
        )
    )
    overrides = [f"validation.data_args.file_name=[{data_file}]"]
    assert main(["validate", "--no-ray", str(path), *overrides]) == 0, capsys.readouterr().err
    assert "prompts checked for their fields (16 train, 4 eval)" in capsys.readouterr().out
    # routed by tag only, the math_rule domain (tag_included [math]) accepts none of these rows
    assert main(["validate", "--no-ray", str(path), *overrides, "actor_train.data_args.domain_key=null"]) == 2
    assert "prompt 0 has tag 'aime2024', which no reward domain accepts" in capsys.readouterr().err


def _rewards(**tags: list[str]) -> dict[str, RewardConfig]:
    return {domain: RewardConfig(reward_type="math", tag_included=own) for domain, own in tags.items()}


def test_route_domain_column_adds_the_rows_tags_to_their_domain() -> None:
    rewards = _rewards(math_rule=["math_dapo"], code=["KodCode"])
    train = [{"tag": "math_dapo"}, {"tag": "KodCode", "domain": "code"}]
    evaluation = [{"tag": "aime2024", "domain": "math_rule"}, {"tag": "MATH-500", "domain": "math_rule"}]
    routed = route_domain_column([train, evaluation], rewards)
    assert routed["math_rule"].tag_included == ["math_dapo", "MATH-500", "aime2024"]
    assert routed["code"] is rewards["code"] and rewards["math_rule"].tag_included == ["math_dapo"]
    assert split_by_domain(evaluation, routed) == {"math_rule": [0, 1], "code": []}
    assert route_domain_column([train], rewards) is rewards  # no new tags: the same rewards


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"tag": "x", "domain": "llm_judge"}], "names reward domain 'llm_judge' in its domain column, which is not"),
        ([{"tag": "KodCode", "domain": "math_rule"}], "prompt 0 has tag 'KodCode' and domain 'math_rule', but rows"),
        (
            [{"tag": "y", "domain": "math_rule"}, {"tag": "y", "domain": "code"}],
            "prompt 1 has tag 'y' and domain 'code', but rows of that tag go to domain 'math_rule'",
        ),
    ],
)
def test_route_domain_column_refuses_what_tag_routing_cannot_honour(rows: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        route_domain_column([rows], _rewards(math_rule=["math_dapo"], code=["KodCode"]))
