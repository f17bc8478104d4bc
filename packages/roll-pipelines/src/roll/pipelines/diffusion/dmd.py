"""The ``diffusion_dmd`` pipeline: distribution matching distillation of a multi-step teacher into a generator of
``student_steps`` (1-4) steps (real score = the frozen teacher, fake score = a model trained online on the
generator's samples).

Per step: the generator maps fresh noise to images in ``student_steps`` deterministic sampler steps over fixed
timesteps (with more than one, gradients flow through the last step only, from the detached state before it); the images are noised at a random level and both
score models predict the clean image; the generator descends ``fake_x0 - real_x0`` (normalised, DMD's gradient)
plus ``regression_weight`` x MSE to the teacher's ``teacher_steps``-step outputs of paired noise (made at setup);
then the fake score takes ``fake_updates`` denoising steps on the generator's images.

Evaluation: the generator's ``student_steps``-step samples from fixed noise, their Frechet distance and MMD to held-out images
(fixed random conv features), and the ratio to the teacher's ``teacher_steps``-step distance (``val/fd_ratio``,
``val/mmd_ratio``; the teacher's values are measured once at setup).
"""

from __future__ import annotations

from typing import Any

import torch

from roll.pipelines.algorithms.diffusion import add_noise, sample_training_timesteps
from roll.pipelines.base import Role
from roll.pipelines.data.shapes import condition_labels
from roll.pipelines.diffusion.config import DMDConfig
from roll.pipelines.diffusion.pipeline import DiffusionPipeline
from roll.pipelines.diffusion.workers import DiffusionTrainWorker, DiffusionWorker
from roll.pipelines.stages import StepTimer
from roll.protocol import DataProto
from roll.runtime import Cluster

__all__ = ["DMDPipeline"]


class DMDPipeline(DiffusionPipeline):
    config_cls = DMDConfig
    config: DMDConfig

    def setup(self) -> None:
        cfg = self.config
        self.prepare_data("teacher")
        self.open_session()
        clusters = self.create_clusters(
            {
                "generator": Role(DiffusionTrainWorker, cfg.generator, cfg.settings_of("generator")),
                "fake_score": Role(DiffusionTrainWorker, cfg.fake_score, cfg.settings_of("fake_score")),
                "teacher": Role(DiffusionWorker, cfg.teacher, cfg.settings_of("teacher")),
            }
        )
        self.generator, self.fake, self.teacher = clusters["generator"], clusters["fake_score"], clusters["teacher"]
        self.set_checkpoint_clusters(self.generator, self.fake)
        d = cfg.dmd
        teacher_t = self.timesteps(d.teacher_steps)
        teacher_images = self.sample(self.teacher, self.eval_noise, self.eval_labels, teacher_t)["images"]
        self.teacher_distance = self.reference.distance(teacher_images)
        self.save_grid(f"teacher_{d.teacher_steps}step", 0, teacher_images)
        # Regression pairs: noise never used for evaluation, and the teacher's outputs for it.
        self.reg_noise = self.noise(d.regression_pairs, seed=cfg.seed + 777)
        self.reg_labels = condition_labels(d.regression_pairs, seed=cfg.seed + 1)
        self.reg_target = None
        if d.regression_weight > 0:
            self.reg_target = self.sample(self.teacher, self.reg_noise, self.reg_labels, teacher_t)["images"]

    def trained_cluster(self) -> Cluster:
        return self.generator

    def _score_levels(self, n: int) -> torch.Tensor:
        """Noise levels for comparing the scores, uniform over [2%, 98%] of the range (DMD avoids both ends)."""
        total = self.process.num_train_timesteps
        fraction = sample_training_timesteps(self.process, n, generator=self.rng) / total
        return (0.02 + 0.96 * fraction) * total

    def step(self, step: int) -> dict[str, Any]:
        d, timer = self.config.dmd, StepTimer()
        n = d.batch_size
        labels = condition_labels(n, seed=self.config.seed * 100_003 + step)
        noise = self.noise(n)
        with timer.phase("generate"):
            generated = self.sample(self.generator, noise, labels, self.timesteps(d.student_steps), clamp=False)[
                "images"
            ]
        t = self._score_levels(n)
        noisy = DataProto.from_dict(
            {"x_t": add_noise(self.process, generated, self.noise(n), t), "timesteps": t, "class_labels": labels}
        )
        with timer.phase("scores"):
            real_x0, fake_x0 = self.teacher.predict_x0(noisy)["x0"], self.fake.predict_x0(noisy)["x0"]
        rows = {"noise": noise, "class_labels": labels, "real_x0": real_x0, "fake_x0": fake_x0}
        if self.reg_target is not None:
            index = torch.randint(0, d.regression_pairs, (n,), generator=self.rng)
            rows.update(
                reg_noise=self.reg_noise[index], reg_labels=self.reg_labels[index], reg_target=self.reg_target[index]
            )
        with timer.phase("train_generator"):
            gen = self.generator.train_dmd_generator(DataProto.from_dict(rows), d.regression_weight, d.student_steps)
        metrics = {f"generator/{k}": v for k, v in gen.meta_info["metrics"].items()}
        with timer.phase("train_fake_score"):
            for _ in range(d.fake_updates):
                batch = {
                    "images": generated,
                    "class_labels": labels,
                    "noise": self.noise(n),
                    "timesteps": sample_training_timesteps(self.process, n, generator=self.rng),
                }
                fake = self.fake.train_denoising(DataProto.from_dict(batch))
        metrics.update({f"fake_score/{k}": v for k, v in fake.meta_info["metrics"].items()})
        return {**metrics, **timer.times}

    def validate(self, step: int) -> dict[str, float]:
        steps = self.config.dmd.student_steps
        images = self.sample(self.generator, self.eval_noise, self.eval_labels, self.timesteps(steps))["images"]
        distance = self.reference.distance(images)
        metrics = {f"val/{k}": v for k, v in distance.items()}
        for key, value in self.teacher_distance.items():
            metrics[f"val/teacher_{key}"] = value
            metrics[f"val/{key}_ratio"] = distance[key] / value
        self.save_grid(f"generator_{steps}step", step, images)
        return metrics
