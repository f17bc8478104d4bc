"""Why does ODE distillation plateau? Train as the recipe does (teacher-forced segments from a fixed pool of
teacher trajectories) and measure, at each evaluation, on TRAINING noises and on HELD-OUT noises:

* ``chained``: the student's own 4-step solve vs the teacher's 50-step output (the recipe's metric);
* ``forced``: the mean one-segment error from the teacher's states (what the loss trains).

A large train/held-out gap means too few trajectories (overfitting); no gap with ``chained`` far above ``forced``
means exposure bias (the student's own states drift from the teacher's, and it never trained on them).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from _common import Clock, emit, fn, load_teacher

from roll.pipelines.algorithms.diffusion import ddim_step, sample_ode
from roll.pipelines.data.shapes import condition_labels
from roll.pipelines.diffusion import (
    PretrainSettings,
    fixed_noise,
    ode_distill_step,
    ode_segment_batch,
    teacher_trajectories,
)
from roll.strategies.diffusion import predict


@torch.no_grad()
def measure(student, process, states, labels, student_t) -> dict[str, float]:
    chained = sample_ode(fn(student), states[:, 0], labels, process, student_t).sample
    forced = []
    for k in range(len(student_t) - 1):
        t = student_t[k].expand(states.shape[0])
        out = predict(student, states[:, k], t, labels)
        step = ddim_step(process, states[:, k], out, t, student_t[k + 1].expand(states.shape[0]))
        forced.append((step - states[:, k + 1]).pow(2).mean().item())
    return {"chained": (chained - states[:, -1]).pow(2).mean().item(), "forced": sum(forced) / len(forced)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-n", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("/tmp/roll-diffusion/ode-diag"))
    args = p.parse_args()
    clock = Clock()
    teacher, process, path = load_teacher(PretrainSettings())
    student = copy.deepcopy(teacher).requires_grad_(True).train()
    tr_noise, tr_labels = fixed_noise(args.pairs, seed=100), condition_labels(args.pairs, seed=0)
    kw = {"teacher_steps": 50, "student_steps": 4}
    tr_states, student_t = teacher_trajectories(fn(teacher), process, tr_noise, tr_labels, **kw)
    ho_noise, ho_labels = fixed_noise(args.eval_n, seed=4321), condition_labels(args.eval_n, seed=5)
    ho_states, _ = teacher_trajectories(fn(teacher), process, ho_noise, ho_labels, **kw)
    tr_eval = slice(0, args.eval_n)
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0)
    rng = torch.Generator().manual_seed(0)
    history = []

    def evaluate(step: int) -> None:
        row: dict[str, float] = {"step": step}
        for name, st, lab in (("train", tr_states[tr_eval], tr_labels[tr_eval]), ("heldout", ho_states, ho_labels)):
            row.update({f"{name}/{k}": v for k, v in measure(student, process, st, lab, student_t).items()})
        history.append(row)
        print(row, flush=True)

    evaluate(0)
    for step in range(1, args.steps + 1):
        index = torch.randint(0, args.pairs, (args.batch,), generator=rng)
        segment = torch.randint(0, 4, (args.batch,), generator=rng)
        batch = ode_segment_batch(tr_states, tr_labels, student_t, index, segment)
        loss, _ = ode_distill_step(fn(student), process, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0:
            evaluate(step)
    emit(
        "ode_diagnose",
        {"teacher": str(path), "settings": vars(args) | {"out": str(args.out)}, "history": history, **clock.report()},
        args.out,
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
