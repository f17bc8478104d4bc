"""Synthetic datasets: deterministic, disjoint splits, a checkable preference rule, idempotent URI resolution."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from roll.pipelines.data import (
    DataError,
    arithmetic_problems,
    arithmetic_prompts,
    arithmetic_sft,
    extract_boxed,
    is_correct_arithmetic,
    load_rows,
    preference_pairs,
    resolve_data_uri,
    solve_arithmetic,
)


def test_generators_are_deterministic_and_well_formed() -> None:
    rows = arithmetic_sft(50, seed=1)
    assert rows == arithmetic_sft(50, seed=1) and rows != arithmetic_sft(50, seed=2)
    for row in rows:
        answer = solve_arithmetic(row["prompt"])
        assert answer is not None and 0 <= answer <= 40
        assert row["response"] == f"The answer is \\boxed{{{answer}}}."
    prompts = arithmetic_prompts(20, seed=0)
    assert prompts == arithmetic_prompts(20, seed=0)
    assert all(p["tag"] == "math" and p["ground_truth"] == str(solve_arithmetic(p["prompt"])) for p in prompts)
    assert arithmetic_sft(3, 0, ops="mul", max_operand=5)[0]["prompt"].count("*") == 1


def test_rows_cover_the_pool_before_repeating() -> None:
    pool = arithmetic_problems("train", max_operand=5)
    rows = arithmetic_sft(len(pool), seed=0, max_operand=5)
    assert len({r["prompt"] for r in rows}) == len(pool)


def test_splits_are_disjoint_for_every_generator() -> None:
    train = {r["prompt"] for r in arithmetic_sft(2000, seed=0, split="train")}
    evals = {r["prompt"] for r in arithmetic_prompts(300, seed=5, split="eval")}
    test = {r["prompt"] for r in preference_pairs(300, seed=9, split="test")}
    assert train and evals and test
    assert not train & evals and not train & test and not evals & test
    pools = {s: {p.prompt for p in arithmetic_problems(s)} for s in ("train", "eval", "test")}
    assert sum(map(len, pools.values())) == len(set().union(*pools.values()))
    assert arithmetic_sft(5, 0, split="val") == arithmetic_sft(5, 0, split="eval")


def test_preference_rule_is_checkable() -> None:
    rows = preference_pairs(200, seed=3)
    assert rows == preference_pairs(200, seed=3)
    assert all(is_correct_arithmetic(r["prompt"], r["chosen"]) for r in rows)
    assert not any(is_correct_arithmetic(r["prompt"], r["rejected"]) for r in rows)
    kinds = {extract_boxed(r["rejected"]) is None for r in rows}
    assert kinds == {True, False}  # both wrong answers and unboxed answers occur


def test_checkers() -> None:
    assert solve_arithmetic("What is 12 - 7?") == 5 and solve_arithmetic("hello") is None
    assert extract_boxed("a \\boxed{1} then \\boxed{ 19 }") == "19"
    assert is_correct_arithmetic("What is 3 * 4?", "so \\boxed{12}.")
    assert not is_correct_arithmetic("What is 3 * 4?", "12")


def test_resolve_data_uri_is_idempotent_and_keyed_by_params(tmp_path: Path) -> None:
    uri = "synthetic://arithmetic_sft?n=30&seed=4&split=train"
    path = resolve_data_uri(uri, tmp_path)
    assert path.parent == tmp_path and path.suffix == ".jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == arithmetic_sft(30, 4, split="train")
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp - 10**9, stamp - 10**9))
    assert resolve_data_uri(uri, tmp_path) == path
    assert path.stat().st_mtime_ns == stamp - 10**9  # not rewritten
    assert resolve_data_uri("synthetic://arithmetic_sft?split=train&seed=4&n=30", tmp_path) == path
    assert resolve_data_uri("synthetic://arithmetic_sft?n=31&seed=4", tmp_path) != path
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary files left


def test_load_rows_resolves_uris_with_split_defaults(tmp_path: Path) -> None:
    train = load_rows("synthetic://arithmetic_prompts?n=10", cache_dir=tmp_path)
    evals = load_rows("synthetic://arithmetic_prompts?n=10", split="eval", cache_dir=tmp_path)
    assert train == arithmetic_prompts(10, 0, split="train")
    assert evals == arithmetic_prompts(10, 0, split="eval")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("synthetic://nope?n=1", r"'synthetic://nope\?n=1' is not a known synthetic dataset.*arithmetic_prompts"),
        ("synthetic://arithmetic_sft?n=x", r"parameter 'n' must be an integer, got 'x'"),
        ("synthetic://arithmetic_sft?size=3", r"unknown parameter 'size'"),
        ("synthetic://arithmetic_sft?n=1&n=2", r"parameter 'n' is given twice"),
        ("synthetic://arithmetic_sft?split=dev", r"unknown synthetic split 'dev'"),
        ("synthetic://arithmetic_sft?ops=div", r"unknown arithmetic ops \['div'\]"),
        ("synthetic://arithmetic_sft?n=0", r"n must be at least 1"),
    ],
)
def test_bad_uris(tmp_path: Path, uri: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        resolve_data_uri(uri, tmp_path)
