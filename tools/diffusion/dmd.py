"""DMD in-process: distil the tiny teacher into a one-step generator by distribution matching (real score = the
frozen teacher, fake score = a copy trained online on the generator's samples), plus an optional regression term
to the teacher's 50-step outputs of paired noise.

Measured with fixed noise and the labels of held-out images: the Frechet distance (fixed random conv features)
of the generator's one-step samples to held-out images must come within 2x the teacher's 50-step distance, from a
one-step start (the teacher itself in one step) far worse. MMD is reported alongside.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from _common import Clock, emit, fn, load_teacher

from roll.pipelines.algorithms.diffusion import sample_training_timesteps
from roll.pipelines.data.shapes import condition_labels, shape_dataset
from roll.pipelines.diffusion import (
    DistributionReference,
    PretrainSettings,
    dmd_fake_score_step,
    dmd_generator_step,
    fixed_noise,
    generate,
    save_image_grid,
)


def dmd_timesteps(process, n: int, generator: torch.Generator, low: float = 0.02, high: float = 0.98) -> torch.Tensor:
    """Noise levels for the score comparison, uniform in [low, high] of the range (DMD avoids both ends)."""
    t = sample_training_timesteps(process, n, generator=generator) / process.num_train_timesteps
    return (low + (high - low) * t) * process.num_train_timesteps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--gen-lr", type=float, default=2e-4)
    parser.add_argument("--fake-lr", type=float, default=2e-4)
    parser.add_argument("--fake-updates", type=int, default=1)
    parser.add_argument("--regression-weight", type=float, default=0.25)
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-n", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/roll-diffusion/dmd"))
    args = parser.parse_args()
    clock = Clock()
    teacher, process, path = load_teacher(PretrainSettings())
    generator_model = copy.deepcopy(teacher).requires_grad_(True).train()
    fake = copy.deepcopy(teacher).requires_grad_(True).train()
    held = shape_dataset("eval")
    reference = DistributionReference.from_images(held.images)
    eval_labels, eval_noise = held.class_labels[: args.eval_n], fixed_noise(args.eval_n, seed=1234)
    teacher_50 = generate(fn(teacher), process, eval_noise, eval_labels, num_steps=50)
    target = reference.distance(teacher_50)
    save_image_grid(teacher_50[:64], args.out / "teacher_50step.png")
    rng = torch.Generator().manual_seed(args.seed)
    reg_noise = fixed_noise(args.pairs, seed=args.seed + 777)  # training pairs: noise never used for evaluation
    reg_labels = condition_labels(args.pairs, seed=args.seed + 1)
    reg_target = (
        generate(fn(teacher), process, reg_noise, reg_labels, num_steps=50) if args.regression_weight > 0 else None
    )
    gen_opt = torch.optim.AdamW(generator_model.parameters(), lr=args.gen_lr, weight_decay=0.0)
    fake_opt = torch.optim.AdamW(fake.parameters(), lr=args.fake_lr, weight_decay=0.0)
    train_labels = condition_labels(args.steps * args.batch, seed=args.seed)
    history = []

    def evaluate(step: int, extra: dict) -> None:
        images = generate(fn(generator_model), process, eval_noise, eval_labels, num_steps=1)
        save_image_grid(images[:64], args.out / f"student_1step_{step:04d}.png")
        history.append({"step": step, **extra, **{f"val/{k}": v for k, v in reference.distance(images).items()}})
        print(history[-1], flush=True)

    evaluate(0, {})
    for step in range(1, args.steps + 1):
        labels = train_labels[(step - 1) * args.batch : step * args.batch]
        shape = (args.batch, 3, 16, 16)
        batch = {
            "noise": torch.randn(shape, generator=rng),
            "class_labels": labels,
            "dmd_noise": torch.randn(shape, generator=rng),
            "dmd_timesteps": dmd_timesteps(process, args.batch, rng),
        }
        if reg_target is not None:
            index = torch.randint(0, args.pairs, (args.batch,), generator=rng)
            batch.update(reg_noise=reg_noise[index], reg_labels=reg_labels[index], reg_target=reg_target[index])
        loss, metrics, generated = dmd_generator_step(
            fn(generator_model), fn(teacher), fn(fake), process, batch, regression_weight=args.regression_weight
        )
        gen_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(generator_model.parameters(), 1.0)
        gen_opt.step()
        for _ in range(args.fake_updates):
            fake_loss, fake_metrics = dmd_fake_score_step(
                fn(fake),
                process,
                generated,
                labels,
                torch.randn(shape, generator=rng),
                sample_training_timesteps(process, args.batch, generator=rng),
            )
            fake_opt.zero_grad(set_to_none=True)
            fake_loss.backward()
            torch.nn.utils.clip_grad_norm_(fake.parameters(), 1.0)
            fake_opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step, {"train/" + k: v for k, v in {**metrics, **fake_metrics}.items()})
    start, end = history[0], history[-1]
    result = {
        "teacher": str(path),
        "settings": vars(args) | {"out": str(args.out)},
        "teacher_50step": target,
        "student_1step_start": {"fd": start["val/fd"], "mmd": start["val/mmd"]},
        "student_1step_end": {"fd": end["val/fd"], "mmd": end["val/mmd"]},
        "end_over_teacher_fd": end["val/fd"] / target["fd"],
        "start_over_teacher_fd": start["val/fd"] / target["fd"],
        "history": history,
        **clock.report(),
    }
    result["pass"] = result["end_over_teacher_fd"] <= 2.0
    emit("dmd", result, args.out)


if __name__ == "__main__":
    torch.set_num_threads(1)  # on a shared, oversubscribed CPU one thread is several times faster than two
    main()
