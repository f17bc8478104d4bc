"""Synthetic datasets: deterministic, leak-free splits, a checkable preference rule, idempotent URI resolution."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
    synthetic,
)
from roll.pipelines.data.synthetic import ArithmeticProblem, parse_arithmetic, problem_key, prompt_key, split_leaks
from roll.pipelines.recipes import list_recipes, recipe_data


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


def test_preference_pairs_differ_in_content_not_format() -> None:
    rows = preference_pairs(200, seed=3)
    assert rows == preference_pairs(200, seed=3)
    assert all(is_correct_arithmetic(r["prompt"], r["chosen"]) for r in rows)
    assert not any(is_correct_arithmetic(r["prompt"], r["rejected"]) for r in rows)
    # Both responses box an answer in the same words: only the number differs.
    for row in rows:
        chosen, rejected = extract_boxed(row["chosen"]), extract_boxed(row["rejected"])
        assert chosen is not None and rejected is not None and chosen != rejected
        assert row["rejected"] == row["chosen"].replace(chosen, rejected)


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


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 12 + 7?", "What is 7 + 12?"),
        ("What is 3 * 9?", "What is 9 * 3?"),
        ("Which is larger: 3 or 7?", "Which is larger: 7 or 3?"),
        ("Which is larger: 3 or 7?", "Which is smaller: 7 or 3?"),
        ("What is 12 + 7?", "  what is 12 + 7?"),
    ],
)
def test_twins_share_a_canonical_key(a: str, b: str) -> None:
    assert prompt_key(a) == prompt_key(b)


def test_different_problems_have_different_keys() -> None:
    keys = {prompt_key(p) for p in ("What is 12 - 7?", "What is 7 - 12?", "What is 12 + 7?", "What is 12 * 7?")}
    assert len(keys) == 4
    assert prompt_key("Say hi") == prompt_key("say   HI") != prompt_key("Say hello")  # other text: duplicates only
    problem = parse_arithmetic("Which is smaller: 8 or 5?")
    assert problem == ArithmeticProblem(8, "min", 5, 5) and problem_key(problem) == "cmp:5,8"


def _synthetic_uris(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    return [name for name in names if name.startswith("synthetic://")]


def _recipe_splits() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Every built-in recipe's synthetic train and eval URIs, by "recipe/role" (rollout-only recipes train on
    nothing: their file_name is what they roll out, often an eval split)."""
    train: dict[str, list[str]] = {}
    evals: dict[str, list[str]] = {}
    for name in list_recipes():
        recipe = recipe_data(name)
        if recipe["pipeline_cls"].endswith("_rollout"):
            continue
        for role, section in recipe.items():
            if isinstance(section, dict) and isinstance(section.get("data_args"), dict):
                data = section["data_args"]
                train[f"{name}/{role}"] = _synthetic_uris(data.get("file_name"))
                evals[f"{name}/{role}"] = _synthetic_uris(data.get("eval_file_name"))
    return train, evals


def _prompts(uris: list[str], tmp_path: Path, split: str) -> list[str]:
    return [row["prompt"] for uri in uris for row in load_rows(uri, split=split, cache_dir=tmp_path)]


def _recipe_leaks(tmp_path: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """Leaks between every recipe's training prompts and every recipe's eval prompts (a warm-up recipe trains the
    model another recipe evaluates, so pairs across recipes count too)."""
    train, evals = _recipe_splits()
    train_prompts = [p for uris in train.values() for p in _prompts(uris, tmp_path, "train")]
    leaks = {}
    for where, uris in evals.items():
        found = split_leaks(train_prompts, _prompts(uris, tmp_path, "eval"))
        if found:
            leaks[where] = found
    return leaks


def test_no_recipe_evaluates_on_a_problem_any_recipe_trains_on(tmp_path: Path) -> None:
    train, evals = _recipe_splits()
    assert sum(map(len, train.values())) >= 5 and sum(map(len, evals.values())) >= 5  # the check covers the recipes
    leaks = _recipe_leaks(tmp_path)
    assert not leaks, {where: list(found.values())[:3] for where, found in leaks.items()}


def test_a_leaky_split_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The old split hashed the problem as written, so "12 + 7" and "7 + 12" could land in different splits.
    monkeypatch.setattr(synthetic, "_split_key", lambda p: f"{p.a} {p.symbol} {p.b}")
    leaks = _recipe_leaks(tmp_path)
    assert leaks
    train_prompt, eval_prompt = next(iter(next(iter(leaks.values())).values()))
    assert train_prompt != eval_prompt and prompt_key(train_prompt) == prompt_key(eval_prompt)


def test_a_recipe_evaluating_on_training_problems_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A recipe whose eval file reads the train split (an easy slip when copying a recipe) leaks every problem.
    original = recipe_data

    def leaky(name: str) -> dict[str, Any]:
        recipe = original(name)
        if name == "rlvr-tiny":
            data = recipe["actor_train"]["data_args"]
            data["eval_file_name"] = data["eval_file_name"].replace("split=eval", "split=train")
        return recipe

    monkeypatch.setitem(globals(), "recipe_data", leaky)
    leaks = _recipe_leaks(tmp_path)
    assert set(leaks) == {"rlvr-tiny/actor_train"} and len(leaks["rlvr-tiny/actor_train"]) > 100


def test_split_leaks_reports_each_shared_problem_once() -> None:
    train = ["What is 1 + 2?", "What is 2 + 1?", "What is 5 - 3?"]
    found = split_leaks(train, ["What is 2 + 1?", "What is 1 + 2?", "What is 3 - 5?", "What is 4 + 4?"])
    assert found == {"+:1,2": ("What is 2 + 1?", "What is 2 + 1?")}


def test_worked_solutions_add_column_by_column(tmp_path: Path) -> None:
    rows = arithmetic_sft(300, seed=2, max_operand=99, ops="add", show_work=1)
    for row in rows:
        answer = solve_arithmetic(row["prompt"])
        assert row["response"].endswith(f"The answer is \\boxed{{{answer}}}.")
        units, tens = row["response"].split(". ")[:2]
        a, b = (int(x) for x in row["prompt"][len("What is ") : -1].split(" + "))
        assert units == f"{a % 10} + {b % 10} = {a % 10 + b % 10}"
        assert tens.startswith(f"{a // 10} + {b // 10}") and tens.endswith(f"= {answer // 10}")
    assert any("+ 1 =" in row["response"] for row in rows)  # carries happen
    pairs = preference_pairs(200, seed=2, max_operand=99, ops="add", show_work=1)
    assert all(is_correct_arithmetic(r["prompt"], r["chosen"]) for r in pairs)
    assert not any(is_correct_arithmetic(r["prompt"], r["rejected"]) for r in pairs)
    assert all(r["chosen"].split(". ")[0] != r["rejected"].split(". ")[0] for r in pairs)  # the units step slips
    with pytest.raises(DataError, match="needs ops=add"):
        arithmetic_sft(3, show_work=1, ops="add,sub")
    assert resolve_data_uri("synthetic://preference_pairs?n=2&ops=add&show_work=1", tmp_path).is_file()


def test_carry_slips_forget_the_carry_on_that_share_of_carrying_sums_only(tmp_path: Path) -> None:
    clean = arithmetic_sft(2000, seed=3, max_operand=99, ops="add", show_work=1)
    rows = arithmetic_sft(2000, seed=3, max_operand=99, ops="add", show_work=1, carry_slip_percent=60)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in clean]  # the same problems, only answers change
    carrying = slipped = 0
    for row in rows:
        a, b = (int(x) for x in row["prompt"][len("What is ") : -1].split(" + "))
        answer = a + b
        if a % 10 + b % 10 < 10:
            assert is_correct_arithmetic(row["prompt"], row["response"])  # nothing to forget
            continue
        carrying += 1
        if is_correct_arithmetic(row["prompt"], row["response"]):
            assert f"{a // 10} + {b // 10} + 1 = " in row["response"]
            continue
        slipped += 1
        # The slip: the tens column without "+ 1", the answer 10 too small, in the same words and format.
        assert row["response"].split(". ")[1] == f"{a // 10} + {b // 10} = {a // 10 + b // 10}"
        assert row["response"].endswith(f"The answer is \\boxed{{{answer - 10}}}.")
    assert carrying > 700 and abs(slipped / carrying - 0.60) < 0.04
    via_uri = resolve_data_uri(
        "synthetic://arithmetic_sft?n=2000&seed=3&max_operand=99&ops=add&show_work=1&carry_slip_percent=60", tmp_path
    )
    assert [json.loads(line) for line in via_uri.read_text().splitlines()] == rows
    with pytest.raises(DataError, match="carry_slip_percent must be within 0..100, got 101"):
        arithmetic_sft(3, ops="add", show_work=1, carry_slip_percent=101)
    with pytest.raises(DataError, match=r"carry_slip_percent needs worked solutions \(show_work=1\)"):
        arithmetic_sft(3, ops="add", carry_slip_percent=50)
