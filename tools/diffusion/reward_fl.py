"""Reward-FL in-process: fine-tune the tiny teacher so its samples score higher under a differentiable reward,
with gradients through the last K sampling steps and an L2 regulariser towards the frozen teacher.

Measured on held-out conditions (shape-colour pairs never used as training prompts) with fixed noise:
``val/reward`` (mean reward of samples) must rise >= 30% relative, while the quality measure, the fine-tuned
model's denoising loss on held-out images (fixed noise and levels), stays within 10% of its start.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from _common import Clock, emit, fn, load_teacher

from roll.pipelines.algorithms.diffusion import denoising_eval_loss
from roll.pipelines.data.shapes import condition_labels, shape_dataset
from roll.pipelines.diffusion import (
    DistributionReference,
    PretrainSettings,
    fixed_noise,
    generate,
    reward_fl_step,
    save_image_grid,
)
from roll.pipelines.rewards.image import build_image_reward


def evaluate(model, process, reward, held, noise, labels, reference, sample_steps: int) -> tuple[dict, torch.Tensor]:
    images = generate(fn(model), process, noise, labels, num_steps=sample_steps)
    with torch.no_grad():
        val_reward = reward(images, labels).mean().item()
    quality = denoising_eval_loss(fn(model), held.images, held.class_labels, process)["loss"]
    return {
        "val/reward": val_reward,
        "val/denoising_loss": quality,
        **{f"val/{k}": v for k, v in reference.distance(images).items()},
    }, images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reward", default="analytic", help="IMAGE_REWARDS name")
    parser.add_argument("--reward-terms", default="brightness", help="analytic terms, comma-separated (weight 1)")
    parser.add_argument("--classifier", default=None, help="classifier folder (for --reward classifier)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sample-steps", type=int, default=10)
    parser.add_argument("--grad-steps", type=int, default=4)
    parser.add_argument("--kl-coef", type=float, default=0.02)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-n", type=int, default=192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/roll-diffusion/reward_fl"))
    args = parser.parse_args()
    clock = Clock()
    teacher, process, path = load_teacher(PretrainSettings())
    student = copy.deepcopy(teacher).requires_grad_(True).train()
    kwargs = (
        {"path": args.classifier}
        if args.reward == "classifier"
        else {"weights": dict.fromkeys(args.reward_terms.split(","), 1.0)}
    )
    reward = build_image_reward(args.reward, kwargs)
    held = shape_dataset("eval")
    reference = DistributionReference.from_images(held.images)
    eval_labels = condition_labels(args.eval_n, seed=99, conditions="heldout")
    eval_noise = fixed_noise(args.eval_n, seed=4321)
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    train_labels = condition_labels(args.steps * args.batch, seed=args.seed, conditions="train")
    history = []
    start, images = evaluate(student, process, reward, held, eval_noise, eval_labels, reference, args.sample_steps)
    save_image_grid(images[:64], args.out / "step0000.png")
    history.append({"step": 0, **start})
    print(history[-1], flush=True)
    for step in range(1, args.steps + 1):
        labels = train_labels[(step - 1) * args.batch : step * args.batch]
        batch = {"noise": torch.randn((args.batch, 3, 16, 16), generator=generator), "class_labels": labels}
        loss, metrics = reward_fl_step(
            fn(student),
            fn(teacher),
            reward,
            process,
            batch,
            num_steps=args.sample_steps,
            grad_steps=args.grad_steps,
            kl_coef=args.kl_coef,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0).item()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            values, images = evaluate(
                student, process, reward, held, eval_noise, eval_labels, reference, args.sample_steps
            )
            save_image_grid(images[:64], args.out / f"step{step:04d}.png")
            history.append(
                {
                    "step": step,
                    "train/reward": metrics["reward"],
                    "train/kl": metrics["kl"],
                    "grad_norm": grad_norm,
                    **values,
                }
            )
            print(history[-1], flush=True)
    end = history[-1]
    result = {
        "teacher": str(path),
        "settings": vars(args) | {"out": str(args.out)},
        "val_reward_start": start["val/reward"],
        "val_reward_end": end["val/reward"],
        "val_reward_rel_change": end["val/reward"] / start["val/reward"] - 1,
        "quality_start": start["val/denoising_loss"],
        "quality_end": end["val/denoising_loss"],
        "quality_rel_change": end["val/denoising_loss"] / start["val/denoising_loss"] - 1,
        "fd_start": start["val/fd"],
        "fd_end": end["val/fd"],
        "history": history,
        **clock.report(),
    }
    result["pass"] = result["val_reward_rel_change"] >= 0.30 and abs(result["quality_rel_change"]) <= 0.10
    emit("reward_fl", result, args.out)


if __name__ == "__main__":
    torch.set_num_threads(1)  # on a shared, oversubscribed CPU one thread is several times faster than two
    main()
