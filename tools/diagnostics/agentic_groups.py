"""Where GRPO's signal comes from on agentic-frozenlake-tiny's groups: success or the format penalty?
(docs/results/agentic.md, "Learning dynamics"). No model: a scripted policy plays through roll's real env managers.

Usage: python -m tools.diagnostics.agentic_groups [NOISE] [BAD_FORMAT] [STEPS]
  NOISE: the planner's random-move probability (default 0.8, which gives about the warm-up policy's 0.18
  success); BAD_FORMAT: per-turn probability of an unparsable answer (default 0.03, the warm-up's val/format 0.97);
  STEPS: rollout batches of 8 groups x 4 episodes (the recipe's) to average over (default 10).
For each normalisation (``mean_std``, the recipe's GRPO default, and ``mean``) prints: the share of groups whose
outcomes differ in success, the share whose scores differ only by format penalties, the share of the advantage mass
(sum over rows of |A| x assistant tokens) that sits in those format-only groups, and the mean advantage of failed
episodes in groups with no success (what GRPO teaches where nothing succeeded).
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict

import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.pipeline import AgenticConfig
from roll.agentic.pipeline.advantage import compute_agentic_targets
from roll.agentic.policy import MockPolicyClient
from roll.agentic.policy.expert import FrozenLakeExpert
from roll.agentic.scheduler import RolloutScheduler
from roll.strategies import GenerationConfig
from roll.strategies.testing import default_corpus, make_tokenizer

GROUPS, SIZE = 8, 4


class SloppyExpert(FrozenLakeExpert):
    """The noisy planner, answering unparsable text with probability ``bad``."""

    def __init__(self, noise: float, bad: float) -> None:
        super().__init__(noise=noise)
        self.bad = bad

    def __call__(self, prompt: str, rng: random.Random) -> str:
        answer = super().__call__(prompt, rng)
        return "Left" if rng.random() < self.bad else answer


def _config(method: str) -> AgenticConfig:
    role = {"model_name_or_path": "/models/tiny"}
    return AgenticConfig.model_validate(
        {
            "actor_train": {"model_args": role},
            "actor_infer": {"model_args": role},
            "custom_envs": {"Lake": {"env_type": "frozen_lake", "env_manager_cls": "traj"}},
            "train_env_manager": {"num_env_groups": GROUPS, "group_size": SIZE, "tags": ["Lake"]},
            "rollout_batch_size": GROUPS * SIZE,
            "reward_normalization": {"grouping": "traj_group_id", "method": method},
        }
    )


def main() -> None:
    noise = float(sys.argv[1]) if len(sys.argv) > 1 else 0.8
    bad = float(sys.argv[2]) if len(sys.argv) > 2 else 0.03
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    tokenizer = make_tokenizer(default_corpus(0, 400) + ["<answer>Up</answer> <answer>Left</answer>"] * 50, 512)
    lake = CustomEnvConfig(
        env_type="frozen_lake",
        env_config={"size": 4, "p": 0.8, "is_slippery": False, "format_penalty": -0.1},
        max_steps=6,
        max_tokens_per_step=16,
        env_manager_cls="traj",
    )
    manager = EnvManagerConfig(num_env_groups=GROUPS, group_size=SIZE, tags=["Lake"])
    client = MockPolicyClient(tokenizer, SloppyExpert(noise, bad), seed=1)
    scheduler = RolloutScheduler.local(
        manager, {"Lake": lake}, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=2048,
    )  # fmt: skip
    totals: dict[str, list[float]] = defaultdict(list)
    try:
        for step in range(1, steps + 1):
            batch = scheduler.get_batch(GROUPS * SIZE, step).batch
            if batch is None:
                continue
            success = [bool(v) for v in batch.non_tensor_batch["success"]]
            groups = list(batch.non_tensor_batch["traj_group_id"])
            scores = batch.batch["scores"].tolist()
            members = defaultdict(list)
            for i, g in enumerate(groups):
                members[g].append(i)
            mixed = {g for g, rows in members.items() if len({success[i] for i in rows}) > 1}
            format_only = {g for g, rows in members.items() if g not in mixed and len({scores[i] for i in rows}) > 1}
            no_success = {g for g, rows in members.items() if not any(success[i] for i in rows)}
            totals["success"].append(sum(success) / len(success))
            totals["mixed_groups"].append(len(mixed) / len(members))
            totals["format_only_groups"].append(len(format_only) / len(members))
            for method in ("mean_std", "mean"):
                copy = batch.select_idxs(list(range(len(batch))))
                compute_agentic_targets(copy, _config(method))
                mask = copy.batch["response_mask"].float()
                mass = (copy.batch["advantages"].abs() * mask).sum(-1)
                fo = torch.tensor([g in format_only for g in groups])
                totals[f"{method}/format_only_mass"].append(float(mass[fo].sum() / mass.sum().clamp_min(1e-9)))
                failed = [i for i, g in enumerate(groups) if g in no_success and g in format_only]
                adv = copy.batch["advantages"].sum(-1) / mask.sum(-1)
                pos = [float(adv[i]) for i in failed if adv[i] > 0]
                totals[f"{method}/pos_adv_of_failures"].append(sum(pos) / max(1, len(pos)))
                ok = [float(adv[i]) for i in range(len(groups)) if success[i] and groups[i] in mixed]
                totals[f"{method}/adv_of_successes"].append(sum(ok) / max(1, len(ok)))
    finally:
        scheduler.close()
    print(f"noise {noise}, bad-format rate {bad}, {steps} batches of {GROUPS}x{SIZE}")
    for key, values in totals.items():
        print(f"  {key:32s} {sum(values) / len(values):.3f}")


if __name__ == "__main__":
    main()
