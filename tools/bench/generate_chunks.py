"""Does hf_infer's ``generate_batch_size`` matter for an agentic turn on the CPU? (agentic.md 78)

One turn of the FrozenLake recipes is ``--rows`` prompts (the train manager's 32 envs; validation's 128) of
``--prompt-tokens`` tokens, each generating ``--new-tokens`` (every row the same length: ``ignore_eos``), on the
recipes' tiny model (``--preset micro``, float32). hf_infer splits a batch into ``generate()`` calls of
``generate_batch_size`` prompts (default 16); each size in ``--chunks`` gets an engine of its own, and the
repetitions are interleaved so that machine load falls on all alike. Reported: seconds per turn (median and best of
``--reps`` after one warm-up call) and each size's ratio to the default's. If the engine were bound by per-call
overhead, fewer, larger calls would win; if by arithmetic, the size would not matter.

    python -m tools.bench.generate_chunks                              # 32 and 128 rows, chunks 8-128
    python -m tools.bench.generate_chunks --rows 8 --chunks 4 8 --reps 1 --new-tokens 2   # smoke
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench._measure import environment, freeze_heap, interleaved
from tools.bench._report import add_report_arguments, emit_result, fmt_seconds, table


def engines(preset: str, chunks: list[int]) -> dict[int, Any]:
    from roll.strategies.testing import make_tiny_causal_lm
    from roll.strategies.testing.train import tiny_strategy

    path = make_tiny_causal_lm(Path(tempfile.gettempdir()) / "roll-generate-chunks" / preset, preset=preset, seed=0)
    return {
        chunk: tiny_strategy(path, "hf", strategy="hf_infer", strategy_config={"generate_batch_size": chunk})
        for chunk in chunks
    }


def measure_rows(args: argparse.Namespace, rows: int, built: dict[int, Any], default: int) -> dict[str, Any]:
    import torch

    from roll.protocol import DataProto
    from roll.strategies import GenerationConfig

    tokenizer = next(iter(built.values())).tokenizer
    rng = random.Random(rows)
    prompts = [[rng.randrange(10, tokenizer.vocab_size) for _ in range(args.prompt_tokens)] for _ in range(rows)]
    batch = DataProto.from_dict(
        {"input_ids": torch.tensor(prompts), "attention_mask": torch.ones(rows, args.prompt_tokens, dtype=torch.long)}
    )
    config = GenerationConfig(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    chunks = [chunk for chunk in args.chunks if chunk <= rows]

    def run(chunk: int) -> float:
        started = time.perf_counter()
        built[chunk].generate(batch, config)
        return time.perf_counter() - started

    times = interleaved(run, chunks, args.reps)
    medians = {chunk: statistics.median(t) for chunk, t in times.items()}
    base = medians.get(default)
    return {
        "rows": rows,
        "median_s": medians,
        "best_s": {chunk: min(t) for chunk, t in times.items()},
        "vs_default": {chunk: m / base for chunk, m in medians.items()} if base else {},
        "times_s": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128], help="prompts of one turn")
    parser.add_argument("--chunks", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="generate_batch_size")
    parser.add_argument("--prompt-tokens", type=int, default=140, help="about a step-wise FrozenLake prompt")
    parser.add_argument("--new-tokens", type=int, default=6, help="about a FrozenLake answer")
    parser.add_argument("--preset", default="micro", help="tiny model (the recipes use micro)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions of every point (median)")
    add_report_arguments(parser)
    args = parser.parse_args()
    from roll.strategies.hf.config import HfInferConfig

    default = HfInferConfig.model_fields["generate_batch_size"].default  # the size the ratios compare against
    args.chunks = sorted({*args.chunks, default})
    freeze_heap()
    built = engines(args.preset, args.chunks)
    results = [measure_rows(args, rows, built, default) for rows in args.rows]
    print(
        f"hf_infer generate, {args.preset} model, {args.prompt_tokens} prompt + {args.new_tokens} new tokens a row; "
        f"seconds a turn, median (best) of {args.reps}; ratio to generate_batch_size {default}:"
    )
    lines = [
        [
            r["rows"],
            chunk,
            f"{fmt_seconds(r['median_s'][chunk])} ({fmt_seconds(r['best_s'][chunk])})",
            f"{r['vs_default'][chunk]:.2f}" if r["vs_default"] else "-",
        ]
        for r in results
        for chunk in r["median_s"]
    ]
    print(table(lines, ["rows", "generate_batch_size", "seconds a turn", f"vs {default}"]))
    emit_result(
        {
            "benchmark": "generate_chunks",
            "preset": args.preset,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "results": results,
            "environment": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
