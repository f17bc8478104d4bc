"""ODE distillation in-process: a 4-step student learns the teacher's 50-step ODE trajectories.

Training pairs: noise from training seeds -> the teacher's 50-step trajectory, kept at the student's 5 boundaries
(a subset of the teacher's timesteps). Each student step from a teacher state should land on the teacher's next
state. Measured on held-out noises (a seed never used for training): the MSE between the student's 4-step output
and the teacher's 50-step output. Bound, fixed before running: at most 0.25x the start (the teacher itself run
with the student's 4 steps).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from _common import Clock, emit, fn, load_teacher

from roll.pipelines.algorithms.diffusion import sample_ode
from roll.pipelines.data.shapes import condition_labels
from roll.pipelines.diffusion import (
    PretrainSettings,
    fixed_noise,
    ode_distill_step,
    ode_segment_batch,
    save_image_grid,
    teacher_trajectories,
)

BOUND_FRACTION = 0.25


@torch.no_grad()
def student_mse(student, process, noise, labels, student_t, target) -> tuple[float, torch.Tensor]:
    out = torch.cat(
        [
            sample_ode(fn(student), noise[i : i + 256], labels[i : i + 256], process, student_t).sample
            for i in range(0, noise.shape[0], 256)
        ]
    )
    return (out - target).pow(2).mean().item(), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--student-steps", type=int, default=4)
    parser.add_argument("--teacher-steps", type=int, default=50)
    parser.add_argument("--pairs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-n", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/roll-diffusion/ode"))
    args = parser.parse_args()
    clock = Clock()
    teacher, process, path = load_teacher(PretrainSettings())
    student = copy.deepcopy(teacher).requires_grad_(True).train()
    train_noise, train_labels = (
        fixed_noise(args.pairs, seed=args.seed + 100),
        condition_labels(args.pairs, seed=args.seed),
    )
    states, student_t = teacher_trajectories(
        fn(teacher),
        process,
        train_noise,
        train_labels,
        teacher_steps=args.teacher_steps,
        student_steps=args.student_steps,
    )
    held_noise, held_labels = fixed_noise(args.eval_n, seed=98765), condition_labels(args.eval_n, seed=5)
    held_states, _ = teacher_trajectories(
        fn(teacher),
        process,
        held_noise,
        held_labels,
        teacher_steps=args.teacher_steps,
        student_steps=args.student_steps,
    )
    held_target = held_states[:, -1]
    save_image_grid(held_target[:64], args.out / "teacher_50step.png")
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0)
    rng = torch.Generator().manual_seed(args.seed)
    history = []

    def evaluate(step: int, extra: dict) -> None:
        mse, images = student_mse(student, process, held_noise, held_labels, student_t, held_target)
        save_image_grid(images[:64].clamp(-1, 1), args.out / f"student_{args.student_steps}step_{step:04d}.png")
        history.append({"step": step, **extra, "val/mse_to_teacher": mse})
        print(history[-1], flush=True)

    evaluate(0, {})
    for step in range(1, args.steps + 1):
        index = torch.randint(0, args.pairs, (args.batch,), generator=rng)
        segment = torch.randint(0, args.student_steps, (args.batch,), generator=rng)
        batch = ode_segment_batch(states, train_labels, student_t, index, segment)
        loss, metrics = ode_distill_step(fn(student), process, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step, {"train/loss": metrics["loss"]})
    start, end = history[0]["val/mse_to_teacher"], history[-1]["val/mse_to_teacher"]
    result = {
        "teacher": str(path),
        "settings": vars(args) | {"out": str(args.out)},
        "student_timesteps": student_t.tolist(),
        "mse_start": start,
        "mse_end": end,
        "bound": BOUND_FRACTION * start,
        "history": history,
        **clock.report(),
    }
    result["pass"] = end <= result["bound"]
    emit("ode_distill", result, args.out)


if __name__ == "__main__":
    torch.set_num_threads(1)  # on a shared, oversubscribed CPU one thread is several times faster than two
    main()
