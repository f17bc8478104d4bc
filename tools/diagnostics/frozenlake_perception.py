"""Can the recipe's model learn to read a FrozenLake grid by behaviour cloning, and from how many moves?

Usage: python -m tools.diagnostics.frozenlake_perception [--preset micro] [--steps 400] [--batch 140] [--lr 1e-3]
       [--labels noisy clean] [--state-noise 0.5] [--eval-every 40] [--eval-states 400] [--prompt grid|chat|full]
       [--seed 0] [--threads 2]
       python -m tools.diagnostics.frozenlake_perception --checkpoint ACTOR_TRAIN_DIR [...] --prompt chat

A plain torch loop (no Ray, no pipeline), one single-turn sample per move: the prompt is one grid
(``--prompt grid``, ~20 tokens), the grid in the chat template (``chat``), or the chat template with the recipe's
instructions and the grid, as the managers' first turn shows it (``full``, ~100 tokens); the target
``<answer>Move</answer>``. ``--seed``: the model's initialisation (``tiny://<preset>?seed=N``). Training states come
from episodes of a demonstrator on training layouts: the planner moving at random with probability ``--state-noise``
(0.5 by default; 0 visits only the planner's shortest paths, the states the recipes' noise-free warm-ups clone). The
label is either the move the demonstrator made (``noisy``) or the planner's move on that state (``clean``: same
states, no random labels). Held-out states always come from the 0.5 demonstrator. Every ``--eval-every`` steps: on
400 states of held-out (``val`` split) layouts, the share of greedy moves that are optimal (on a shortest path:
tools.diagnostics.frozenlake_moves.grade) and of moves into a hole, with chance (a uniform mover) beside them, and
per move M the share of the boards where M falls into a hole on which the greedy move was M (``hole_M``).
``--batch 140`` x 80 steps is about the recipe's warm-up (80 steps of 32 episodes, ~4.4 moves each).

``--checkpoint``: no training; the same grading of trained weights, each an ``actor_train`` folder of a run's
checkpoint (``<output_dir>/checkpoints/step-N/actor_train``) or of a warm-up cache entry
(``$ROLL_CACHE_DIR/agentic-warmup/<key>/actor_train``), loaded into ``tiny://<preset>?seed=<seed>``. With ``--prompt
chat`` this is what the step-wise recipe (the grid alone in the chat template) shows the policy.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from roll.agentic.env.frozen_lake import FrozenLakeEnv
from roll.agentic.policy.expert import FrozenLakeExpert
from tools.diagnostics.cloning import tiny_model, update
from tools.diagnostics.frozenlake_moves import grade, tally

ACTIONS = ("Left", "Down", "Right", "Up")
RECIPE_INSTRUCTION = "FrozenLake: P is you, G the goal, O a hole. Answer like <answer>Left</answer>."  # the recipe's


def states(split: str, seed: int, noise: float) -> Iterator[tuple[str, str, str, dict]]:
    """(instructions, grid, demonstrator's move, grade table) along the demonstrator's episodes on ``split``."""
    rng, expert, planner = random.Random(seed), FrozenLakeExpert(noise=noise), FrozenLakeExpert(noise=0.0)
    episode = 0
    while True:
        env = FrozenLakeEnv(size=4, p=0.8, max_steps=6, split=split, env_instruction=RECIPE_INSTRUCTION)
        grid, info = env.reset(seed * 1_000_003 + episode)
        episode += 1
        for _ in range(6):
            lines = grid.split("\n")
            table = grade(lines)
            if table is None:
                break
            answer = expert(f"Turn 1:\n{grid}", rng)
            planned = planner.action(lines)
            yield info["env_instruction"], grid, answer, {"table": table, "planned": planned}
            grid, _, terminated, truncated, _ = env.step(answer)
            if terminated or truncated:
                break


def encode(
    tokenizer, instruction: str, grid: str, answer: str | None, prompt_kind: str = "grid"
) -> tuple[list[int], int]:
    if prompt_kind == "grid":  # the grid alone: the same perception problem at a fifth of the tokens
        prompt = f"{grid}\n"
    else:  # the chat template around the grid, with the recipe's instructions for "full" (~100 tokens a sample)
        content = f"{instruction}\nTurn 1:\n{grid}" if prompt_kind == "full" else grid
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if answer is None:
        return ids, len(ids)
    target = tokenizer(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"]
    return ids + target + [tokenizer.eos_token_id], len(ids)


@torch.no_grad()
def evaluate(model, tokenizer, held_out: list[tuple[str, str, str, dict]], prompt_kind: str) -> dict[str, float]:
    """Greedy choice among the four answers by their log-likelihood (no parsing failures to confound)."""
    answered = []
    candidates = [tokenizer(f"<answer>{a}</answer>", add_special_tokens=False)["input_ids"] for a in ACTIONS]
    for instruction, grid, _, info in held_out:
        prompt, start = encode(tokenizer, instruction, grid, None, prompt_kind)
        rows = [prompt + c for c in candidates]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        logits = model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)
        scores = []
        for i, cand in enumerate(candidates):
            picked = logits[i, start - 1 : start - 1 + len(cand)].gather(-1, torch.tensor(cand)[:, None])
            scores.append(float(picked.sum()))
        move = ACTIONS[max(range(4), key=scores.__getitem__)]
        answered.append((info["table"], move))
    found = tally(answered)
    return {
        "optimal": found["optimal"],
        "into_hole": found["into_hole"],
        "chance_optimal": found["random_optimal"],
        **{key: value for key, value in found.items() if key.startswith("hole_")},
    }


def shown(result: dict[str, float]) -> str:
    return " ".join(f"{key}={value:.3f}" for key, value in result.items())


def checkpoint_weights(actor_train: Path) -> dict[str, torch.Tensor]:
    """The model weights of an ``actor_train`` checkpoint folder (fsdp2's distributed checkpoint in ``model_optim``)."""
    with tempfile.TemporaryDirectory() as folder:
        merged = Path(folder) / "merged.pt"
        dcp_to_torch_save(actor_train / "model_optim", merged)
        return torch.load(merged, weights_only=False)["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="micro")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=140)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--labels", nargs="+", default=["noisy", "clean"], choices=["noisy", "clean"])
    parser.add_argument("--state-noise", type=float, default=0.5)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-states", type=int, default=400)
    parser.add_argument("--prompt", default="grid", choices=["grid", "chat", "full"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", nargs="+", type=Path, default=[])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    held_out = [s for s, _ in zip(states("val", 7, 0.5), range(args.eval_states))]
    if args.checkpoint:
        tokenizer, model = tiny_model(args.preset, args.seed)
        for folder in args.checkpoint:
            model.load_state_dict(checkpoint_weights(folder))
            model.eval()
            print(f"{folder} prompt={args.prompt}: {shown(evaluate(model, tokenizer, held_out, args.prompt))}")
        return
    for labels in args.labels:
        torch.manual_seed(args.seed)
        tokenizer, model = tiny_model(args.preset, args.seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        stream = states("train", 1, args.state_noise)
        started = time.perf_counter()
        print(
            f"labels={labels} state_noise={args.state_noise} prompt={args.prompt} seed={args.seed} "
            f"preset={args.preset} lr={args.lr} batch={args.batch}"
        )
        print(f"  step 0: {shown(evaluate(model, tokenizer, held_out, args.prompt))}")
        for step in range(1, args.steps + 1):
            rows = []
            for instruction, grid, answer, info in (next(stream) for _ in range(args.batch)):
                label = answer.removeprefix("<answer>").removesuffix("</answer>")
                if labels == "clean":
                    label = info["planned"] or label
                ids, start = encode(tokenizer, instruction, grid, label, args.prompt)
                rows.append((ids, [0] * start + [1] * (len(ids) - start)))
            loss = update(model, optimizer, tokenizer.pad_token_id, rows)
            if step % args.eval_every == 0:
                model.eval()
                result = evaluate(model, tokenizer, held_out, args.prompt)
                elapsed = time.perf_counter() - started
                print(f"  step {step} ({step * args.batch} moves, {elapsed:.0f} s): loss {loss:.3f} {shown(result)}")


if __name__ == "__main__":
    main()
