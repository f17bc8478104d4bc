"""Diffusion maths as free functions on tensors: the noising process (vp/DDPM and rectified flow), denoising
targets (epsilon, v, flow velocity), the DDIM/Euler sampler with truncated backpropagation, the Reward-FL, DMD and
ODE-distillation losses, and quality measures (held-out denoising loss, MMD and Frechet distances on fixed random
conv features). Models are passed as callables ``model_fn(x_t, t, class_labels)``; nothing here imports diffusers.
"""

from __future__ import annotations

from roll.pipelines.algorithms.diffusion._losses import (
    denoising_loss,
    dmd_fake_score_loss,
    dmd_generator_loss,
    ode_distill_loss,
    ode_student_timesteps,
    regression_loss,
    reward_fl_loss,
)
from roll.pipelines.algorithms.diffusion._metrics import (
    denoising_eval_loss,
    frechet_distance,
    image_features,
    median_bandwidth,
    mmd_rbf,
    random_feature_net,
)
from roll.pipelines.algorithms.diffusion._process import (
    PREDICTION_TYPES,
    NoiseProcess,
    add_noise,
    coefficients,
    denoising_target,
    flow_process,
    noise_process_from_scheduler,
    predicted_x0_and_noise,
    sample_training_timesteps,
    sampling_timesteps,
    vp_process,
)
from roll.pipelines.algorithms.diffusion._sampling import Denoiser, SampleOutput, ddim_step, sample_ode

__all__ = [
    "PREDICTION_TYPES",
    "Denoiser",
    "NoiseProcess",
    "SampleOutput",
    "add_noise",
    "coefficients",
    "ddim_step",
    "denoising_eval_loss",
    "denoising_loss",
    "denoising_target",
    "dmd_fake_score_loss",
    "dmd_generator_loss",
    "flow_process",
    "frechet_distance",
    "image_features",
    "median_bandwidth",
    "mmd_rbf",
    "noise_process_from_scheduler",
    "ode_distill_loss",
    "ode_student_timesteps",
    "predicted_x0_and_noise",
    "random_feature_net",
    "regression_loss",
    "reward_fl_loss",
    "sample_ode",
    "sample_training_timesteps",
    "sampling_timesteps",
    "vp_process",
]
