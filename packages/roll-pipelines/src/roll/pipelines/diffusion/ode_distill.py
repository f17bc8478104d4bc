"""The ``diffusion_ode_distill`` pipeline: a few-step student learns the teacher's ODE trajectories.

At setup the teacher solves the probability-flow ODE from ``num_trajectories`` noises in ``teacher_steps`` steps and
keeps its states at the student's ``student_steps + 1`` boundaries (a subset of its own timesteps). Per step:
random (trajectory, segment) pairs; one student step from the teacher's state at a boundary should land on the
teacher's state at the next one.

Evaluation: the student samples in ``student_steps`` steps from fixed held-out noise (never a training trajectory);
``val/mse_to_teacher`` is the MSE to the teacher's ``teacher_steps``-step outputs of the same noise, and
``val/mse_ratio`` its ratio to step 0 (the teacher itself in ``student_steps`` steps).
"""

from __future__ import annotations

from typing import Any

import torch

from roll.pipelines.algorithms.diffusion import ode_student_timesteps
from roll.pipelines.base import Role
from roll.pipelines.data.shapes import condition_labels
from roll.pipelines.diffusion.config import ODEDistillConfig
from roll.pipelines.diffusion.pipeline import DiffusionPipeline
from roll.pipelines.diffusion.steps import ode_segment_batch
from roll.pipelines.diffusion.workers import DiffusionTrainWorker, DiffusionWorker
from roll.pipelines.stages import StepTimer
from roll.protocol import DataProto
from roll.runtime import Cluster

__all__ = ["ODEDistillPipeline"]


class ODEDistillPipeline(DiffusionPipeline):
    config_cls = ODEDistillConfig
    config: ODEDistillConfig

    def setup(self) -> None:
        cfg, o = self.config, self.config.ode
        self.prepare_data("teacher")
        self.open_session()
        clusters = self.create_clusters(
            {
                "student": Role(DiffusionTrainWorker, cfg.student, cfg.settings_of("student")),
                "teacher": Role(DiffusionWorker, cfg.teacher, cfg.settings_of("teacher")),
            }
        )
        self.student, self.teacher = clusters["student"], clusters["teacher"]
        self.set_checkpoint_clusters(self.student)
        teacher_t = self.timesteps(o.teacher_steps)
        self.student_t, index = ode_student_timesteps(teacher_t, o.student_steps)
        noise = self.noise(o.num_trajectories, seed=o.trajectory_seed + 100)
        self.train_labels = condition_labels(o.num_trajectories, seed=o.trajectory_seed)
        self.states = self.sample(self.teacher, noise, self.train_labels, teacher_t, keep=index.tolist(), clamp=False)[
            "states"
        ]
        self.eval_target = self.sample(self.teacher, self.eval_noise, self.eval_labels, teacher_t, clamp=False)[
            "images"
        ]
        self.save_grid(f"teacher_{o.teacher_steps}step", 0, self.eval_target)

    def trained_cluster(self) -> Cluster:
        return self.student

    def step(self, step: int) -> dict[str, Any]:
        o, timer = self.config.ode, StepTimer()
        index = torch.randint(0, o.num_trajectories, (o.batch_size,), generator=self.rng)
        segment = torch.randint(0, o.student_steps, (o.batch_size,), generator=self.rng)
        batch = ode_segment_batch(self.states, self.train_labels, self.student_t, index, segment)
        with timer.phase("train"):
            out = self.student.train_ode(DataProto.from_dict(dict(batch)))
        return {**{f"train/{k}": v for k, v in out.meta_info["metrics"].items()}, **timer.times}

    def validate(self, step: int) -> dict[str, float]:
        images = self.sample(self.student, self.eval_noise, self.eval_labels, self.student_t, clamp=False)["images"]
        mse = float((images - self.eval_target).pow(2).mean())
        if not self.baseline:
            self.baseline = {"mse_to_teacher": mse}
        self.save_grid(f"student_{self.config.ode.student_steps}step", step, images.clamp(-1, 1))
        metrics = {"val/mse_to_teacher": mse, "val/mse_ratio": mse / self.baseline["mse_to_teacher"]}
        metrics.update({f"val/{k}": v for k, v in self.reference.distance(images.clamp(-1, 1)).items()})
        return metrics
