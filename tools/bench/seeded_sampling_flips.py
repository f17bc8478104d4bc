"""How often does batch composition flip a seeded row's sampled token on hf_infer? (docs/results/agentic.md section 63)

Seeded rows (sampling_seed column) generated: alone (batch 1), all in one batch, and in shuffled batches of 8.
Reports requests whose tokens differ from the alone run and the share of tokens up to the first difference.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import torch

from roll.protocol import DataProto
from roll.strategies import GenerationConfig, ModelArgs, StrategyArgs, StrategyWorker, StrategyWorkerConfig
from roll.strategies.testing import make_tiny_causal_lm

preset, dtype, n, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
path = make_tiny_causal_lm(Path(tempfile.gettempdir()) / "roll-seeded-flips" / preset, preset=preset, seed=0)
if preset == "nano":  # spread the weights as test_hf_infer's peaked_model does
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.15)
    peaked = path.parent / "nano-peaked"
    model.save_pretrained(peaked)
    AutoTokenizer.from_pretrained(path).save_pretrained(peaked)
    path = peaked


def strategy(batch_size: int):
    config = StrategyWorkerConfig(
        name="hf",
        model_args=ModelArgs.model_validate({"model_name_or_path": str(path), "dtype": dtype}),
        strategy_args=StrategyArgs(
            strategy_name="hf_infer", strategy_config={"generate_batch_size": batch_size, "cpu_bfloat16": True}
        ),
    )
    worker = StrategyWorker(config)
    worker.initialize()
    return worker.strategy


rng = random.Random(0)
vocab = 500
prompts = [[rng.randrange(10, vocab) for _ in range(rng.randrange(4, 40))] for _ in range(n)]
seeds = [rng.randrange(2**31) for _ in range(n)]
config = GenerationConfig(max_new_tokens=steps, temperature=1.0, ignore_eos=True)


def batch_of(rows: list[int]) -> DataProto:
    width = max(len(prompts[r]) for r in rows)
    ids = torch.tensor([[3] * (width - len(prompts[r])) + prompts[r] for r in rows])
    mask = torch.tensor([[0] * (width - len(prompts[r])) + [1] * len(prompts[r]) for r in rows])
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "sampling_seed": torch.tensor([seeds[r] for r in rows])}
    )


def run(engine, groups: list[list[int]]) -> dict[int, tuple[list[int], list[float]]]:
    out = {}
    for rows in groups:
        result = engine.generate(batch_of(rows), config)
        for i, r in enumerate(rows):
            out[r] = (result.batch["responses"][i].tolist(), result.batch["rollout_log_probs"][i].tolist())
    return out


alone = run(strategy(1), [[r] for r in range(n)])
order = list(range(n))
rng.shuffle(order)
results = {
    "one batch": run(strategy(n), [list(range(n))]),
    "shuffled 8s": run(strategy(8), [order[i : i + 8] for i in range(0, n, 8)]),
}
for name, got in results.items():
    differ = [r for r in range(n) if got[r][0] != alone[r][0]]
    first = [next(t for t in range(steps) if got[r][0][t] != alone[r][0][t]) for r in differ]
    same_tokens = sum(first) + (n - len(differ)) * steps
    lp = max([abs(a - b) for r in range(n) if r not in differ for a, b in zip(got[r][1], alone[r][1])], default=0.0)
    print(
        f"{preset} {dtype} {name}: {len(differ)}/{n} requests differ (median first step {sorted(first)[len(first) // 2] if first else None}); "
        f"{len(differ)} flips in {same_tokens + len(differ)} draws; max |dlogp| on identical rows {lp:.2e}"
    )
