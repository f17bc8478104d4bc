"""What the load-time sequence_length check of a dataset env costs (docs/results/agentic.md section 64).

A jsonl of ``--rows`` math-like questions (``--chars`` characters on average, uniform from 1/3 to 5/3 of it) is
checked as ``roll validate`` checks a ``roll_math`` tag: reading the file, ranking its questions by tokens
(:func:`roll.agentic.env.dataset.longest_rows`: every question when they hold at most ``COUNTED_CHARS`` characters,
else the longest by characters), and the whole tag check (ranking plus rendering the first prompts of the longest
rows through the env manager). Baseline: the check before it, one first prompt rendered. The tokenizer is the
byte-level BPE (vocab 512) of ``roll.strategies.testing``; a real one's larger vocabulary makes fewer tokens.

    python -m tools.bench.length_check_rows --rows 10000 --chars 600
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench._report import add_report_arguments, emit_result, fmt_seconds, table

WORDS = ["the", "a", "of", "integer", "find", "sum", "prime", "triangle", "\\frac{1}{2}", "x^2", "+", "y^2", "=", "25",
         "area", "radius", "circle", "probability"]  # fmt: skip


def write_dataset(folder: Path, rows: int, chars: int, seed: int) -> Path:
    rng = random.Random(seed)
    path = folder / f"questions-{rows}x{chars}.jsonl"
    with path.open("w") as f:
        for i in range(rows):
            text = ""
            target = rng.randint(chars // 3, chars * 5 // 3)
            while len(text) < target:
                text += rng.choice(WORDS) + " "
            f.write(json.dumps({"problem": text.strip(), "answer": str(i)}) + "\n")
    return path


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The median of ``repeats`` wall times of ``fn()``, and its last value."""
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from roll.agentic.env import dataset
    from roll.agentic.pipeline import AgenticConfig, lengths
    from roll.agentic.pool import build_env
    from roll.strategies import GenerationConfig
    from roll.strategies.testing import default_corpus, make_tokenizer

    tokenizer = make_tokenizer(default_corpus(0, 400), 512)
    path = write_dataset(Path(tempfile.mkdtemp(prefix="roll-length-check-")), args.rows, args.chars, args.seed)
    role = {"model_args": {"model_name_or_path": "/models/not-here"}}
    spec = {"env_type": "roll_math", "env_config": {"dataset_name": str(path)}, "max_tokens_per_step": 16}
    config = AgenticConfig.model_validate(
        {
            "actor_train": role,
            "actor_infer": {**role, "generating_args": {"max_new_tokens": 16}},
            "custom_envs": {"Math": spec},
            "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["Math"]},
            "rollout_batch_size": 1,
            "advantage": {"estimator": "reinforce"},
            "sequence_length": 1 << 20,
        }
    )
    keys = {"question_key": ("problem", str), "answer_key": ("answer", (str, int, float))}

    def read() -> list[dict[str, Any]]:
        dataset._CACHE.clear()
        dataset._CHECKED.clear()
        return dataset.load_questions(str(path), None, keys, env="roll_math")

    read_s, rows = timed(read, args.repeats)
    total_chars = sum(len(row["problem"]) for row in rows)
    rank_s, ranked = timed(lambda: dataset.longest_rows(rows, "problem", tokenizer, dataset=str(path)), args.repeats)
    saved = dataset.COUNTED_CHARS
    dataset.COUNTED_CHARS = total_chars
    try:
        every_s, exact = timed(lambda: dataset.longest_rows(rows, "problem", tokenizer, dataset=str(path)), 1)
    finally:
        dataset.COUNTED_CHARS = saved
    check = config.length_checks(tokenizer)[-1]
    check_s, line = timed(check, args.repeats)
    one = config.custom_envs["Math"]
    baseline_s, _ = timed(
        lambda: lengths._prompt_lengths(
            "Math", one, tokenizer, build_env(one), seeds=[0], generation_config=GenerationConfig()
        ),
        args.repeats,
    )
    return {
        "rows": args.rows,
        "total_chars": total_chars,
        "counted_chars": saved,
        "every_row_counted": ranked.every_row,
        "longest_found": ranked.tokens[0],
        "longest_exact": exact.tokens[0],
        "read_s": read_s,
        "rank_s": rank_s,
        "rank_every_row_s": every_s,
        "tag_check_s": check_s,
        "baseline_one_prompt_s": baseline_s,
        "tag_check_over_baseline": check_s / baseline_s,
        "line": line,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10000, help="questions in the generated jsonl")
    parser.add_argument("--chars", type=int, default=600, help="average characters per question")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per step (the median is reported)")
    parser.add_argument("--seed", type=int, default=0)
    add_report_arguments(parser)
    args = parser.parse_args()
    result = measure(args)
    mode = "every row" if result["every_row_counted"] else f"longest by characters (> {result['counted_chars']:,})"
    print(
        table(
            [
                ["read the jsonl (first time)", fmt_seconds(result["read_s"]), ""],
                [f"rank by tokens: {mode}", fmt_seconds(result["rank_s"]), str(result["longest_found"])],
                ["rank by tokens: every row", fmt_seconds(result["rank_every_row_s"]), str(result["longest_exact"])],
                ["the tag's check (rank + 4 prompts)", fmt_seconds(result["tag_check_s"]), ""],
                ["baseline: one first prompt", fmt_seconds(result["baseline_one_prompt_s"]), ""],
            ],
            ["step", "median", "longest (row, tokens)"],
        )
    )
    print(f"{result['rows']} rows, {result['total_chars']:,} characters; check / baseline = "
          f"{result['tag_check_over_baseline']:.2f}x")  # fmt: skip
    emit_result({"benchmark": "length_check_rows", **result}, args.result_file)


if __name__ == "__main__":
    main()
