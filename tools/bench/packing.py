"""Benchmark of token-budget micro-batches and sequence packing on fsdp2_train: padding, step time, exactness.

    python -m tools.bench.packing                      # micro preset, 32 rows, long-tail responses, 9 reps
    python -m tools.bench.packing --quick              # smoke run: nano, 12 rows, 1 rep

The batch looks like an RLVR step's: ``--rows`` left-padded prompts of 8..``--prompt-len`` random tokens and
right-padded responses with a long tail: ``--long-share`` of the rows run to ``--response-len`` (the generation
budget), the rest are short (4..``--short-len`` tokens). One tiny model (``make_tiny_causal_lm``, float32, sdpa)
is loaded by four ``fsdp2_train`` strategies in this process, which differ only in their ``batching`` settings:

* ``padded``: fixed micro-batches of ``--micro-rows`` rows (forward: ``--infer-rows``), every row T columns wide;
* ``dynamic``: token-budget micro-batches of at most micro-rows x T tokens (the same memory bound), rows grouped by
  length and all-padding columns dropped;
* ``packed``: the fixed micro-batches, each packed into one padding-free sequence;
* ``both``: packed sequences filled up to the same token budget.

Each repetition times, mode after mode (so every mode sees the same machine load), one ``forward_step`` (response
log-probs with ``logits_to_keep``, as the RLVR workers call it) and one ``train_step`` (a token-level policy
gradient loss over the response mask). Reported per mode: the share of computed tokens that are padding, the
fastest repetition's step times, the median over repetitions of padded time / mode time within the same
repetition (every repetition runs all modes, in a rotated order, so a ratio compares times under the same load), and, before any training, the largest
absolute difference of the response log-probs from ``padded`` (over real response tokens). The last stdout line
is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench import CACHE_DIR
from tools.bench._measure import environment, freeze_heap, summarize
from tools.bench._report import add_report_arguments, emit_result, fmt_seconds, table

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

MODES = ("padded", "dynamic", "packed", "both")


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def make_batch(args: argparse.Namespace) -> Any:
    import torch

    from roll.protocol import DataProto

    gen = torch.Generator().manual_seed(args.seed)
    rows, prompt_len, response_len = args.rows, args.prompt_len, args.response_len
    ids = torch.randint(10, 200, (rows, prompt_len + response_len), generator=gen)
    mask = torch.ones_like(ids)
    long_rows = max(1, round(args.long_share * rows))
    for row in range(rows):
        prompt = int(torch.randint(8, prompt_len + 1, (1,), generator=gen))
        if row % max(1, rows // long_rows) == 0 and long_rows > 0:
            response, long_rows = response_len, long_rows - 1
        else:
            response = int(torch.randint(4, args.short_len + 1, (1,), generator=gen))
        mask[row, : prompt_len - prompt] = 0
        mask[row, prompt_len + response :] = 0
    ids = ids.masked_fill(mask == 0, args.pad_id)
    advantages = torch.randn(rows, 1, generator=gen)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt_len:],
            "response_mask": mask[:, prompt_len:].clone(),
            "advantages": advantages.expand(rows, response_len).contiguous(),
        }
    )


def response_log_probs(micro: Any, logits: Any) -> dict[str, Any]:
    from roll.strategies.ops import log_probs_from_logits

    width = micro.batch["responses"].shape[1]
    picked = log_probs_from_logits(logits[:, -width - 1 : -1], micro.batch["responses"])
    return {"log_probs": picked * micro.batch["response_mask"]}


def pg_loss(micro: Any, logits: Any, scale: Any) -> tuple[Any, dict[str, float]]:
    log_probs = response_log_probs(micro, logits)["log_probs"]
    loss = -(log_probs * micro.batch["advantages"] * micro.batch["response_mask"]).sum() / scale.num_tokens
    return loss, {}


def batching_settings(mode: str, args: argparse.Namespace, width: int) -> dict[str, Any]:
    train_budget, infer_budget = args.micro_rows * width, args.infer_rows * width
    dynamic = {
        "dynamic_batching_in_train": True,
        "max_tokens_per_microbatch_in_train": train_budget,
        "dynamic_batching_in_infer": True,
        "max_tokens_per_microbatch_in_infer": infer_budget,
    }
    return {"padded": {}, "dynamic": dynamic, "packed": {"sequence_packing": True}}.get(
        mode, {**dynamic, "sequence_packing": True}
    )


def make_strategy(model: Path, mode: str, args: argparse.Namespace, width: int) -> Any:
    from roll.strategies import (
        BatchingArgs,
        ModelArgs,
        StrategyArgs,
        StrategyWorker,
        StrategyWorkerConfig,
        TrainingArgs,
    )

    config = StrategyWorkerConfig(
        name=f"actor-{mode}",
        model_args=ModelArgs(model_name_or_path=str(model), dtype="float32", attn_implementation="sdpa"),
        training_args=TrainingArgs(learning_rate=1e-6, per_device_train_batch_size=args.micro_rows),
        strategy_args=StrategyArgs(strategy_name="fsdp2_train"),
        infer_batch_size=args.infer_rows,
        batching=BatchingArgs(**batching_settings(mode, args, width)),
    )
    worker = StrategyWorker(config)
    worker.initialize()
    return worker.strategy


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from roll.strategies.testing import make_tiny_causal_lm

    torch.set_num_threads(args.threads)
    model = make_tiny_causal_lm(CACHE_DIR / "bench-packing" / args.preset, preset=args.preset, seed=0)
    batch = make_batch(args)
    mask = batch.batch["attention_mask"]
    width = mask.shape[1]
    keep = args.response_len + 1
    strategies = {mode: make_strategy(model, mode, args, width) for mode in MODES}
    freeze_heap()

    # Exactness first, while every strategy holds the same weights.
    log_probs = {
        m: s.forward_step(batch, response_log_probs, logits_to_keep=keep)["log_probs"] for m, s in strategies.items()
    }
    real = batch.batch["response_mask"].bool()
    diffs = {m: float((log_probs[m] - log_probs["padded"])[real].abs().max()) for m in MODES}
    padding = {m: {"forward": s.padding.padded_fraction} for m, s in strategies.items()}

    # "padded_all_logits": the padded strategy asked for every position's logits (no logits_to_keep): the lever
    # "no logits for prompt positions" measured against the padded path.
    timed = (*MODES, "padded_all_logits")
    clocks = {"cpu": time.process_time, "wall": time.perf_counter}
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        c: {m: {"forward": [], "train": []} for m in timed} for c in clocks
    }
    first_loss: dict[str, float] = {}
    for rep in range(args.warmup + args.reps):
        # Rotate the order each repetition so no mode always runs right after another's memory churn.
        for mode in timed[rep % len(timed) :] + timed[: rep % len(timed)]:
            strategy = strategies[mode.removesuffix("_all_logits")]
            mode_keep = None if mode.endswith("_all_logits") else keep
            marks = [{c: clock() for c, clock in clocks.items()}]
            strategy.forward_step(batch, response_log_probs, logits_to_keep=mode_keep)
            marks.append({c: clock() for c, clock in clocks.items()})
            metrics = strategy.train_step(batch, pg_loss, loss_mask_key="response_mask", logits_to_keep=mode_keep)
            marks.append({c: clock() for c, clock in clocks.items()})
            first_loss.setdefault(mode, float(metrics["loss"]))
            if mode in padding:
                padding[mode]["train"] = strategy.padding.padded_fraction
            if rep >= args.warmup:
                for c in clocks:
                    times[c][mode]["forward"].append(marks[1][c] - marks[0][c])
                    times[c][mode]["train"].append(marks[2][c] - marks[1][c])
        log(f"rep {rep + 1}/{args.warmup + args.reps} done")
    modes: dict[str, Any] = {}
    for mode in timed:
        entry: dict[str, Any] = {
            "padded_fraction": padding.get(mode, padding["padded"]),
            "log_prob_max_abs_diff": diffs.get(mode, 0.0),
        }
        for c in clocks:
            for phase in ("forward", "train"):
                base, mine = times[c]["padded"][phase], times[c][mode][phase]
                entry[f"{phase}_{c}"] = summarize(mine)
                entry[f"{phase}_{c}_speedup"] = _paired_speedup(base, mine)
        modes[mode] = entry
    return {
        "benchmark": "packing",
        "preset": args.preset,
        "rows": args.rows,
        "width": width,
        "real_token_share": float(mask.float().mean()),
        "response_lengths": batch.batch["response_mask"].sum(1).tolist(),
        "threads": args.threads,
        "first_step_loss": first_loss,
        "modes": modes,
        "environment": environment(),
    }


def _paired_speedup(baseline: list[float], candidate: list[float]) -> float:
    """Median over repetitions of padded time / this mode's time in the same repetition (the same machine load)."""
    return statistics.median(b / c for b, c in zip(baseline, candidate, strict=True))


def report(result: dict[str, Any]) -> None:
    rows = []
    for mode, r in result["modes"].items():
        rows.append(
            [
                mode,
                f"{r['padded_fraction']['forward']:.1%}",
                f"{r['padded_fraction']['train']:.1%}",
                fmt_seconds(r["forward_cpu"]["median_s"]),
                f"{r['forward_cpu_speedup']:.2f}x",
                fmt_seconds(r["train_cpu"]["median_s"]),
                f"{r['train_cpu_speedup']:.2f}x",
                f"{r['forward_wall_speedup']:.2f}x / {r['train_wall_speedup']:.2f}x",
                f"{r['log_prob_max_abs_diff']:.1e}",
            ]
        )
    headers = ["mode", "pad fwd", "pad train", "fwd cpu", "x", "train cpu", "x", "wall x (fwd/train)", "|dlogp| max"]
    print(
        f"{result['preset']} model, {result['rows']} rows x {result['width']} columns, "
        f"{result['real_token_share']:.1%} real tokens, {result['threads']} thread(s), "
        f"load {result['environment']['loadavg']}"
    )
    print(table(rows, headers))
    print(
        "cpu: median CPU seconds of the process per call; x: median over repetitions of padded / mode in the same "
        "repetition"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="micro", choices=["nano", "micro", "small"])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=128, help="generation budget: the long rows' length")
    parser.add_argument("--short-len", type=int, default=32, help="longest of the short responses")
    parser.add_argument("--long-share", type=float, default=0.125, help="share of rows at --response-len")
    parser.add_argument("--micro-rows", type=int, default=8, help="per_device_train_batch_size of the fixed path")
    parser.add_argument("--infer-rows", type=int, default=16, help="infer_batch_size of the fixed path")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: gentle on a shared machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pad-id", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="nano, 12 rows, short lengths, 1 rep")
    add_report_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.rows, args.prompt_len, args.response_len, args.short_len = "nano", 12, 12, 32, 8
        args.micro_rows, args.infer_rows, args.reps, args.warmup = 4, 6, 1, 0
    result = run(args)
    report(result)
    emit_result(result, args.result_file)


if __name__ == "__main__":
    main()
