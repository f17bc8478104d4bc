"""The diffusion pipelines (``diffusion_pretrain``, ``diffusion_reward_fl``, ``diffusion_dmd``,
``diffusion_ode_distill``) and their shared pieces: one training step of each as a loss (:mod:`.steps`), the role
workers (:mod:`.workers`), configs (:mod:`.config`), evaluation (sampling with fixed noise, distances to the data),
image grids, and the in-process reference of the teacher's pretraining (:mod:`.teacher`; recipes use
``recipe://diffusion-pretrain-tiny``). The maths is in
:mod:`roll.pipelines.algorithms.diffusion`, the models in :mod:`roll.strategies.diffusion`, the data in
:mod:`roll.pipelines.data.shapes`, rewards in :mod:`roll.pipelines.rewards.image`.

Pipelines and configs are imported lazily (through the pipeline registry), so this package imports without Ray.
"""

from __future__ import annotations

from roll.pipelines.diffusion.evaluation import DistributionReference, fixed_noise, generate
from roll.pipelines.diffusion.images import image_grid, save_image_grid
from roll.pipelines.diffusion.steps import (
    dmd_fake_score_step,
    dmd_generator_step,
    ema_decay_at,
    ema_update,
    generator_sample,
    ode_distill_step,
    ode_segment_batch,
    pretrain_batch,
    pretrain_step,
    reward_fl_step,
    teacher_trajectories,
)
from roll.pipelines.diffusion.teacher import PretrainSettings, pretrain_teacher

__all__ = [
    "DistributionReference",
    "PretrainSettings",
    "dmd_fake_score_step",
    "dmd_generator_step",
    "ema_decay_at",
    "ema_update",
    "fixed_noise",
    "generate",
    "generator_sample",
    "image_grid",
    "ode_distill_step",
    "ode_segment_batch",
    "pretrain_batch",
    "pretrain_step",
    "pretrain_teacher",
    "reward_fl_step",
    "save_image_grid",
    "teacher_trajectories",
]
