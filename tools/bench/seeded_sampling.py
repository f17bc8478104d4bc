"""What does seeded sampling cost on hf_infer? One decode step's sampling, and whole generate() calls (agentic.md 65).

Step: the time to turn one step's logits (``--rows`` x ``--vocabs``, float32, random with a spread like a model's)
into tokens, with hf_infer's own processor chain for ``--temperature``/``--top-p`` (``build_logits_processors``) in
front of each of
- "multinomial": transformers' unseeded path (softmax, then ``torch.multinomial`` on the whole batch), the baseline;
- "generators": the seeded sampler as first committed (027e7c5): one CPU ``torch.Generator`` per row, a host loop
  of one draw per row, float64 softmax and cumsum, a last-positive-token clamp (the reference, kept in
  ``_generator_row_sampler.py``);
- "counter": the current ``SeededRowSampler``: counter-based uniforms hashed from (seed, step) on the logits' device,
  float32 weights summed in float64, buffers reused between steps.
The seeded ones also pay for generate()'s argmax over their one-hot scores. On ``--device cpu`` and, when present,
``cuda`` (``--device auto``: both).

Generate: hf_infer ``generate`` of ``--gen-rows`` prompts x ``--gen-tokens`` tokens on a tiny model of
``roll.strategies.testing`` (``--preset``; the recipes use "micro"; ``--gen-vocab`` widens its vocabulary to a real
model's), temperature 1, unseeded vs seeded with each sampler, repetitions interleaved so machine load falls on all
alike. Ratios are against "multinomial" (step) and "unseeded" (generate).

    python -m tools.bench.seeded_sampling                       # 8/64/256 rows x 32,000/151,936 vocab + generate
    python -m tools.bench.seeded_sampling --rows 64 --vocabs 151936 --gen-vocab 151936   # generate at Qwen's vocab
    python -m tools.bench.seeded_sampling --rows 8 --vocabs 32000 --reps 2 --gen-rows 4 --gen-tokens 4   # smoke
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from tools.bench._measure import environment, freeze_heap, interleaved, measure
from tools.bench._report import add_report_arguments, emit_result, fmt_seconds, table

# torch, transformers and roll.strategies are imported inside the functions, so that --help answers at once
if TYPE_CHECKING:
    import torch
    from transformers.generation.logits_process import LogitsProcessor

    from roll.strategies import GenerationConfig


SAMPLER_NAMES = ("generators", "counter")  # the seeded samplers compared, in table order


def sampler_types() -> dict[str, Callable[[Sequence[int]], LogitsProcessor]]:
    from roll.strategies.hf._sampling import SeededRowSampler
    from tools.bench._generator_row_sampler import GeneratorRowSampler

    return dict(zip(SAMPLER_NAMES, (GeneratorRowSampler, SeededRowSampler), strict=True))


def step_paths(rows: int, config: GenerationConfig) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """One decode step's sampling per path: scores -> tokens, as generate() does it."""
    import torch

    from roll.strategies.hf._sampling import build_logits_processors

    pad = torch.zeros(rows, dtype=torch.long)
    unseeded = build_logits_processors(config, pad, None)

    def multinomial(scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(unseeded(None, scores), dim=-1)  # type: ignore[arg-type]
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    paths: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"multinomial": multinomial}
    for name, sampler_type in sampler_types().items():
        chain = build_logits_processors(config, pad, None, sampler_type(range(rows)))  # type: ignore[arg-type]
        paths[name] = lambda scores, chain=chain: chain(None, scores).argmax(dim=-1)  # type: ignore[misc]
    return paths


def timed(
    path: Callable[[torch.Tensor], torch.Tensor], scores: torch.Tensor, device: torch.device
) -> Callable[[], Any]:
    import torch

    def run() -> torch.Tensor:
        tokens = path(scores)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return tokens

    return run


def measure_steps(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    import torch

    from roll.strategies import GenerationConfig

    config = GenerationConfig(temperature=args.temperature, top_p=args.top_p)
    results = []
    for vocab in args.vocabs:
        for rows in args.rows:
            generator = torch.Generator().manual_seed(rows * 7 + vocab)
            scores = (torch.randn((rows, vocab), generator=generator) * 3.0).to(device)

            times = {
                name: measure(timed(path, scores, device), reps=args.reps, warmup=1)
                for name, path in step_paths(rows, config).items()
            }
            base = times["multinomial"]["median_s"]
            results.append(
                {
                    "device": device.type,
                    "rows": rows,
                    "vocab": vocab,
                    **{f"{name}_s": t["median_s"] for name, t in times.items()},
                    **{f"{name}_min_s": t["min_s"] for name, t in times.items()},
                    **{
                        f"{name}_vs_multinomial": t["median_s"] / base
                        for name, t in times.items()
                        if name != "multinomial"
                    },
                }
            )
    return results


def tiny_engine(preset: str, vocab: int | None, device: str) -> Any:
    from roll.strategies.testing import make_tiny_causal_lm
    from roll.strategies.testing.train import tiny_strategy

    name = preset if vocab is None else f"{preset}-vocab{vocab}"
    path = make_tiny_causal_lm(
        Path(tempfile.gettempdir()) / "roll-seeded-sampling" / name,
        preset=preset,
        seed=0,
        overrides=None if vocab is None else {"vocab_size": vocab},
    )
    return tiny_strategy(
        path, "hf", strategy="hf_infer", strategy_config={"generate_batch_size": 1024, "device": device}
    )


def measure_generate(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    from roll.protocol import DataProto
    from roll.strategies import GenerationConfig
    from roll.strategies.hf import strategy as hf_strategy

    strategy = tiny_engine(args.preset, args.gen_vocab, device)
    rng = random.Random(0)
    vocab = strategy.model.config.vocab_size  # the logits' width
    prompts = [
        [rng.randrange(10, strategy.tokenizer.vocab_size) for _ in range(rng.randrange(8, 40))]
        for _ in range(args.gen_rows)
    ]
    width = max(len(p) for p in prompts)
    columns = {
        "input_ids": torch.tensor([[3] * (width - len(p)) + p for p in prompts]),
        "attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
    }
    seeded = DataProto.from_dict({**columns, "sampling_seed": torch.arange(args.gen_rows) * 101})
    unseeded = DataProto.from_dict(columns)
    config = GenerationConfig(max_new_tokens=args.gen_tokens, temperature=1.0, ignore_eos=True, seed=0)

    def run(variant: str) -> float:
        with mock.patch.object(hf_strategy, "SeededRowSampler", samplers.get(variant, samplers["counter"])):
            t0 = time.perf_counter()
            strategy.generate(unseeded if variant == "unseeded" else seeded, config)
            return time.perf_counter() - t0

    samplers = sampler_types()
    variants = ["unseeded", *SAMPLER_NAMES]
    times = interleaved(run, variants, args.reps)
    medians = {v: statistics.median(t) for v, t in times.items()}
    best = {v: min(t) for v, t in times.items()}  # the repetition least disturbed by other processes
    return {
        "device": device,
        "preset": args.preset,
        "vocab": vocab,
        "rows": args.gen_rows,
        "tokens": args.gen_tokens,
        **{f"{v}_s": m for v, m in medians.items()},
        **{f"{v}_vs_unseeded": medians[v] / medians["unseeded"] for v in SAMPLER_NAMES},
        **{f"{v}_best_s": b for v, b in best.items()},
        **{f"{v}_best_vs_unseeded": best[v] / best["unseeded"] for v in SAMPLER_NAMES},
        "times_s": times,
    }


def devices(choice: str) -> list[torch.device]:
    import torch

    if choice == "auto":
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --device cpu or auto")
    return [torch.device(choice)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cpu, and cuda if present"
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 151_936], help="151,936 is Qwen2.5's")
    parser.add_argument("--temperature", type=float, default=1.0, help="as the agentic recipes")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions of every measurement (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--preset", default="micro", help="tiny model of the generate part")
    parser.add_argument("--gen-rows", type=int, default=32, help="prompts of the generate part (0 skips it)")
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument(
        "--gen-vocab",
        type=int,
        default=None,
        help="the model's vocabulary (logits' width), e.g. 151936; default the preset's",
    )
    add_report_arguments(parser)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    freeze_heap()

    steps = [row for device in devices(args.device) for row in measure_steps(args, device)]
    print(f"One decode step's sampling (temperature {args.temperature}, top-p {args.top_p}; median of {args.reps}):")
    print(
        table(
            [
                [
                    r["device"],
                    r["rows"],
                    r["vocab"],
                    fmt_seconds(r["multinomial_s"]),
                    fmt_seconds(r["generators_s"]),
                    fmt_seconds(r["counter_s"]),
                    f"{r['generators_vs_multinomial']:.2f}",
                    f"{r['counter_vs_multinomial']:.2f}",
                    f"{r['counter_s'] / r['generators_s']:.2f}",
                ]
                for r in steps
            ],
            [
                "device",
                "rows",
                "vocab",
                "multinomial",
                "generators",
                "counter",
                "gen/multi",
                "counter/multi",
                "counter/gen",
            ],
        )
    )
    generate = []
    if args.gen_rows > 0:
        generate = [measure_generate(args, device.type) for device in devices(args.device)]
        vocab = generate[0]["vocab"]
        print(
            f"\nhf_infer generate, {args.preset} model (vocab {vocab}), {args.gen_rows} prompts x {args.gen_tokens} tokens:"
        )
        rows = []
        for g in generate:
            for stat, key in (("median", ""), ("best", "_best")):
                rows.append(
                    [
                        g["device"],
                        f"{stat} of {args.reps}",
                        *(fmt_seconds(g[f"{v}{key}_s"]) for v in ("unseeded", *SAMPLER_NAMES)),
                        *(f"{g[f'{v}{key}_vs_unseeded']:.2f}" for v in SAMPLER_NAMES),
                    ]
                )
        headers = ["device", "time", "unseeded", "generators", "counter", "generators/unseeded", "counter/unseeded"]
        print(table(rows, headers, left=(0, 1)))
    emit_result(
        {
            "benchmark": "seeded_sampling",
            "threads": args.threads,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "steps": steps,
            "generate": generate,
            "environment": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
