"""The ``diffusion_pretrain`` pipeline: denoising pretraining of a small class-conditional diffusion model on the
shapes data, with an EMA of its weights: the teacher of the other diffusion recipes (``diffusion-pretrain-tiny``).

Per step the driver draws a batch (training images with replacement, their noise and timesteps, from its seeded
stream, :func:`~roll.pipelines.diffusion.steps.pretrain_batch`); the worker takes one optimizer step on the
denoising loss and updates the EMA (decay :func:`~roll.pipelines.diffusion.steps.ema_decay_at` of the step).
With one worker this is, draw for draw and operation for operation, the in-process
:func:`~roll.pipelines.diffusion.teacher.pretrain_teacher`.

Evaluation (step 0, every ``eval_steps``, the end) runs on the EMA weights: ``val/denoising_loss``, the denoising
loss of every held-out image at each of ``evaluation.denoising_levels`` noise levels with fixed noise (the number
``pretrain_teacher`` records), and samples from fixed noise in ``pretrain.sample_steps`` steps: their image grid in
``plots/`` and their distances to the held-out images (``val/fd``, ``val/mmd``). The export is the EMA model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from roll.pipelines.base import Role
from roll.pipelines.data.shapes import ShapeData, shape_dataset
from roll.pipelines.diffusion.config import DiffusionPretrainConfig
from roll.pipelines.diffusion.pipeline import DiffusionPipeline
from roll.pipelines.diffusion.steps import ema_decay_at, pretrain_batch
from roll.pipelines.diffusion.workers import DiffusionPretrainWorker
from roll.pipelines.stages import StepTimer
from roll.protocol import DataProto
from roll.runtime import Cluster

__all__ = ["DiffusionPretrainPipeline", "heldout_denoising_batch"]


def heldout_denoising_batch(held: ShapeData, kind: str, total: int, levels: int, seed: int) -> dict[str, torch.Tensor]:
    """Rows (level-major) of every held-out image at each of ``levels`` evenly spaced noise levels (midpoints of
    ``levels`` bins of t/T), one noise per image from ``seed``, as ``denoising_eval_loss`` draws them."""
    n = len(held)
    noise = torch.randn(held.images.shape, generator=torch.Generator().manual_seed(seed))
    values = [
        (k + 0.5) / levels * total if kind == "flow" else float(int((k + 0.5) / levels * total)) for k in range(levels)
    ]
    return {
        "images": held.images.repeat(levels, 1, 1, 1),
        "class_labels": held.class_labels.repeat(levels),
        "noise": noise.repeat(levels, 1, 1, 1),
        "timesteps": torch.tensor(values, dtype=torch.float32).repeat_interleave(n),
    }


class DiffusionPretrainPipeline(DiffusionPipeline):
    config_cls = DiffusionPretrainConfig
    config: DiffusionPretrainConfig

    def setup(self) -> None:
        cfg = self.config
        # 1. data (training images, held-out set, evaluation noise, the driver's stream); 2. session; 3. role
        self.prepare_data("denoiser")
        self.train_data: ShapeData = shape_dataset("train", image_size=cfg.image_size)
        self.open_session()
        clusters = self.create_clusters(
            {"denoiser": Role(DiffusionPretrainWorker, cfg.denoiser, cfg.settings_of("denoiser"))}
        )
        self.denoiser = clusters["denoiser"]
        self.set_checkpoint_clusters(self.denoiser)

    def trained_cluster(self) -> Cluster:
        return self.denoiser

    def step(self, step: int) -> dict[str, Any]:
        p, timer = self.config.pretrain, StepTimer()
        batch = pretrain_batch(
            self.train_data.images, self.train_data.class_labels, self.process, p.batch_size, self.rng
        )
        with timer.phase("train"):
            out = self.denoiser.train_pretrain(DataProto.from_dict(batch), ema_decay_at(step - 1, p.ema_decay))
        return {**{f"train/{k}": v for k, v in out.meta_info["metrics"].items()}, **timer.times}

    @contextmanager
    def ema_weights(self) -> Iterator[None]:
        """The EMA weights in the model for the duration (swapped back on every path)."""
        if not all(self.denoiser.swap_ema()):
            raise RuntimeError("swap_ema() did not put the EMA weights in on every rank")
        try:
            yield
        finally:
            self.denoiser.swap_ema()

    def validate(self, step: int) -> dict[str, float]:
        cfg = self.config
        levels = cfg.evaluation.denoising_levels
        rows = heldout_denoising_batch(
            self.held, self.process.kind, self.process.num_train_timesteps, levels, cfg.pretrain.heldout_seed
        )
        with self.ema_weights():
            losses = self.denoising_losses(rows)
            timesteps = self.timesteps(cfg.pretrain.sample_steps)
            images = self.sample(self.denoiser, self.eval_noise, self.eval_labels, timesteps)["images"]
        per_level = losses.view(levels, len(self.held)).mean(dim=1)
        metrics = {"val/denoising_loss": sum(float(x) for x in per_level) / levels}
        metrics.update({f"val/{k}": v for k, v in self.reference.distance(images).items()})
        self.save_grid(f"samples_{cfg.pretrain.sample_steps}step", step, images)
        return metrics

    def denoising_losses(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.denoiser.denoising_losses(DataProto.from_dict(rows))["loss"].float()

    def export_hf(self, cluster: Cluster) -> Any:
        """The EMA model, as a diffusers folder with its scheduler."""
        with self.ema_weights():
            return super().export_hf(cluster)
