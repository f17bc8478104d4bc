"""How often does batch composition flip a seeded row's sampled token on hf_infer? (docs/results/agentic.md section 63)

Seeded rows (sampling_seed column) generated: alone (batch 1), all in one batch, and in shuffled batches of 8.
Reports requests whose tokens differ from the alone run and the share of draws up to the first difference.
Not a timing: machine load does not change the numbers.

    python -m tools.bench.seeded_sampling_flips --preset nano --dtype float32 --requests 32 --steps 16
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from tools.bench._report import add_report_arguments, emit_result, table

VOCAB = 500


def model_path(preset: str) -> Path:
    from roll.strategies.testing import make_tiny_causal_lm, spread_weights

    path = make_tiny_causal_lm(Path(tempfile.gettempdir()) / "roll-seeded-flips" / preset, preset=preset, seed=0)
    # nano's fresh init is near-uniform: spread its weights as test_hf_infer's peaked_model does
    return spread_weights(path, path.parent / "nano-peaked") if preset == "nano" else path


def engine(path: Path, dtype: str, batch_size: int) -> Any:
    from roll.strategies.testing.train import tiny_strategy

    return tiny_strategy(
        path,
        "hf",
        strategy="hf_infer",
        model_args={"dtype": dtype},
        strategy_config={"generate_batch_size": batch_size, "cpu_bfloat16": True},
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from roll.protocol import DataProto
    from roll.strategies import GenerationConfig

    n, steps = args.requests, args.steps
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(10, VOCAB) for _ in range(rng.randrange(4, 40))] for _ in range(n)]
    seeds = [rng.randrange(2**31) for _ in range(n)]
    config = GenerationConfig(max_new_tokens=steps, temperature=1.0, ignore_eos=True)

    def batch_of(rows: list[int]) -> DataProto:
        width = max(len(prompts[r]) for r in rows)
        ids = torch.tensor([[3] * (width - len(prompts[r])) + prompts[r] for r in rows])
        mask = torch.tensor([[0] * (width - len(prompts[r])) + [1] * len(prompts[r]) for r in rows])
        return DataProto.from_dict(
            {"input_ids": ids, "attention_mask": mask, "sampling_seed": torch.tensor([seeds[r] for r in rows])}
        )

    def run(strategy: Any, groups: list[list[int]]) -> dict[int, tuple[list[int], list[float]]]:
        out = {}
        for rows in groups:
            result = strategy.generate(batch_of(rows), config)
            for i, r in enumerate(rows):
                out[r] = (result.batch["responses"][i].tolist(), result.batch["rollout_log_probs"][i].tolist())
        return out

    path = model_path(args.preset)
    alone = run(engine(path, args.dtype, 1), [[r] for r in range(n)])
    order = list(range(n))
    rng.shuffle(order)
    batchings = {
        "one batch": run(engine(path, args.dtype, n), [list(range(n))]),
        "shuffled batches of 8": run(engine(path, args.dtype, 8), [order[i : i + 8] for i in range(0, n, 8)]),
    }
    rows = []
    for name, got in batchings.items():
        differ = [r for r in range(n) if got[r][0] != alone[r][0]]
        first = sorted(next(t for t in range(steps) if got[r][0][t] != alone[r][0][t]) for r in differ)
        draws = sum(first) + (n - len(differ)) * steps + len(differ)  # up to and including each first difference
        same = [r for r in range(n) if r not in differ]
        dlogp = max((abs(a - b) for r in same for a, b in zip(got[r][1], alone[r][1])), default=0.0)
        rows.append(
            {
                "batching": name,
                "requests_differ": len(differ),
                "median_first_difference": first[len(first) // 2] if first else None,
                "flips": len(differ),
                "draws": draws,
                "max_dlogp_identical_rows": dlogp,
            }
        )
    return {"preset": args.preset, "dtype": args.dtype, "requests": n, "steps": steps, "batchings": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="nano", help="a roll.strategies.testing tiny-model preset")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16, help="tokens sampled per request")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and the request seeds")
    add_report_arguments(parser)
    args = parser.parse_args()
    import torch  # here, not at the top: --help answers without loading torch

    torch.set_num_threads(1)
    result = measure(args)
    print(
        table(
            [
                [
                    r["batching"],
                    f"{r['requests_differ']}/{args.requests}",
                    r["median_first_difference"],
                    f"{r['flips']}/{r['draws']}",
                    f"{r['max_dlogp_identical_rows']:.2e}",
                ]
                for r in result["batchings"]
            ],
            ["batching", "requests differ", "median first diff", "flips/draws", "max |dlogp| same rows"],
        )
    )
    emit_result({"benchmark": "seeded_sampling_flips", **result}, args.result_file)


if __name__ == "__main__":
    main()
