"""Does a recipe's advantage favour good moves? A scripted player plays a FrozenLake recipe's training envs through
roll's real env managers and scheduler; the recipe's own advantage settings score the rows; printed: the mean
advantage of the rows whose move was optimal, of the other parsed moves, and of unparsable answers.

Usage: python -m tools.diagnostics.gigpo_signal [RECIPE] [NOISE] [STEPS]
  RECIPE: a step-wise FrozenLake recipe (default agentic-frozenlake-gigpo-tiny); NOISE: the planner's random-move
  probability (default 0.3); STEPS: rollout batches of the recipe's size to average over (default 10).
No model runs: the advantages are the recipe's (`compute_agentic_targets`), the moves a noisy planner's, graded with
:func:`tools.diagnostics.frozenlake_moves.move_kind`. Used in docs/results/agentic.md, 32b.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from roll.agentic.pipeline import AgenticConfig
from roll.agentic.pipeline.advantage import compute_agentic_targets
from roll.agentic.policy import MockPolicyClient
from roll.agentic.policy.expert import FrozenLakeExpert
from roll.agentic.scheduler import RolloutScheduler
from roll.pipelines.config import load_config
from roll.strategies import GenerationConfig
from roll.strategies.testing import default_corpus, make_tokenizer
from tools.diagnostics.frozenlake_moves import move_kind


def advantage_by_move(recipe: str, noise: float, steps: int) -> dict[str, tuple[int, float]]:
    """{"optimal" | "other" | "unparsed": (rows, mean advantage per response token)} over ``steps`` batches."""
    config = load_config(recipe)
    if not isinstance(config, AgenticConfig) or config.layout != "step":
        raise SystemExit(f"{recipe}: a step-wise agentic recipe is needed (env_manager_cls step: one row per move)")
    tokenizer = make_tokenizer(default_corpus(0, 400) + ["<answer>Up</answer> <answer>Left</answer>"] * 50, 512)
    client = MockPolicyClient(tokenizer, FrozenLakeExpert(noise=noise), seed=1)
    scheduler = RolloutScheduler.local(
        config.train_env_manager, config.custom_envs, tokenizer, client,
        generation_config=GenerationConfig(max_new_tokens=16), sequence_length=2048,
    )  # fmt: skip
    found: dict[str, list[float]] = defaultdict(list)
    try:
        for step in range(1, steps + 1):
            batch = scheduler.get_batch(config.rollout.batch_size, step).batch
            if batch is None:
                continue
            compute_agentic_targets(batch, config)
            mask = batch.batch["response_mask"].float()
            advantage = (batch.batch["advantages"] * mask).sum(-1) / mask.sum(-1).clamp_min(1)
            texts = tokenizer.batch_decode(batch.batch["input_ids"], skip_special_tokens=True)
            for row, text in enumerate(texts):
                found[move_kind(text)].append(float(advantage[row]))
    finally:
        scheduler.close()
    return {kind: (len(values), sum(values) / len(values)) for kind, values in sorted(found.items())}


def main() -> None:
    recipe = sys.argv[1] if len(sys.argv) > 1 else "agentic-frozenlake-gigpo-tiny"
    noise = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    print(f"{recipe}, planner noise {noise}, {steps} batches")
    for kind, (rows, mean) in advantage_by_move(recipe, noise, steps).items():
        print(f"  {kind:9s} rows {rows:5d}  mean advantage {mean:+.3f}")


if __name__ == "__main__":
    main()
