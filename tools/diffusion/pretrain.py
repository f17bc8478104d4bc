"""Train (or reuse) the tiny teacher and measure it: held-out denoising loss, and the distance of its 1/4/50-step
samples to held-out images, next to the data's own floor (training images vs held-out images)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _common import Clock, emit, fn, load_teacher

from roll.pipelines.algorithms.diffusion import denoising_eval_loss
from roll.pipelines.data.shapes import shape_dataset
from roll.pipelines.diffusion import DistributionReference, PretrainSettings, fixed_noise, generate, save_image_grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=PretrainSettings().steps)
    parser.add_argument("--samples", type=int, default=512, help="images per distance measurement")
    parser.add_argument("--out", type=Path, default=Path("/tmp/roll-diffusion"))
    args = parser.parse_args()
    clock = Clock()
    settings = PretrainSettings(steps=args.steps)
    teacher, process, path = load_teacher(settings)
    trained = json.loads((path / "roll_pretrain.json").read_text())
    held = shape_dataset("eval")
    reference = DistributionReference.from_images(held.images)
    labels = held.class_labels[: args.samples]
    noise = fixed_noise(args.samples, seed=1234)
    result = {
        "teacher": str(path),
        "steps": settings.steps,
        "train_wall_s": trained["wall_s"],
        "train_cpu_s": trained["cpu_s"],
    }
    result["heldout_denoising_loss"] = denoising_eval_loss(fn(teacher), held.images, held.class_labels, process)["loss"]
    for steps in (1, 4, 50):
        images = generate(fn(teacher), process, noise, labels, num_steps=steps)
        result[f"teacher_{steps}step"] = reference.distance(images)
        save_image_grid(images[:64], args.out / f"teacher_{steps}step.png")
    floor = shape_dataset("train", n=args.samples, seed=1).images
    result["data_floor"] = reference.distance(floor)
    result.update(clock.report())
    emit("pretrain", result, args.out)


if __name__ == "__main__":
    torch.set_num_threads(1)  # on a shared, oversubscribed CPU one thread is several times faster than two
    main()
