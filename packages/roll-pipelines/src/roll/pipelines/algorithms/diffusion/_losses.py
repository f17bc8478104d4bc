"""Losses of diffusion training and distillation: denoising (epsilon / v / flow targets), Reward-FL, distribution
matching distillation (DMD) and ODE (trajectory) distillation. Each returns a scalar to minimise."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roll.pipelines.algorithms.diffusion._process import NoiseProcess, denoising_target
from roll.pipelines.algorithms.diffusion._sampling import ddim_step
from roll.runtime.errors import ConfigError

__all__ = [
    "denoising_loss",
    "dmd_fake_score_loss",
    "dmd_generator_loss",
    "ode_distill_loss",
    "ode_student_timesteps",
    "regression_loss",
    "reward_fl_loss",
]


def _per_sample_mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape:
        raise ConfigError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return (a.float() - b.float()).pow(2).flatten(1).mean(dim=1)


def denoising_loss(
    process: NoiseProcess,
    output: torch.Tensor,
    x0: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean squared error between ``output`` and the process's target for ``(x0, noise, t)``; optional (B,) weights."""
    per_sample = _per_sample_mse(output, denoising_target(process, x0, noise, t))
    return per_sample.mean() if weights is None else (per_sample * weights).sum() / weights.sum().clamp(min=1e-12)


def regression_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error to a fixed target (teacher outputs of paired noise): DMD's regression term and ODE
    distillation's end-to-end variant."""
    return _per_sample_mse(prediction, target.detach()).mean()


def reward_fl_loss(
    rewards: torch.Tensor,
    outputs: Sequence[torch.Tensor] = (),
    reference_outputs: Sequence[torch.Tensor] = (),
    *,
    reward_weight: float = 1.0,
    kl_coef: float = 0.0,
    kl_weights: Sequence[torch.Tensor | float] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reward feedback learning: ``-reward_weight * mean(rewards) + kl_coef * mean_k(w_k * ||out_k - ref_k||^2)``.

    ``rewards`` (B,) must carry gradients back to the sampler's last steps; ``outputs``/``reference_outputs`` are
    the trained and the frozen model's predictions at those steps (from ``sample_ode``). The regulariser keeps
    the trained model near the reference; ``kl_weights`` (per step, scalar or (B,)) scale each step's term,
    e.g. ``1 / (2 sigma^2)`` for the Gaussian KL between the two steps' transition kernels.
    """
    if len(outputs) != len(reference_outputs):
        raise ConfigError(f"{len(outputs)} outputs but {len(reference_outputs)} reference outputs; pass both per step")
    if kl_coef > 0 and not outputs:
        raise ConfigError("kl_coef > 0 needs the model and reference outputs of the gradient steps")
    reward_mean = rewards.float().mean()
    kl = rewards.new_zeros((), dtype=torch.float32)
    for k, (out, ref) in enumerate(zip(outputs, reference_outputs)):
        weight = 1.0 if kl_weights is None else kl_weights[k]
        kl = kl + (_per_sample_mse(out, ref) * weight).mean()
    if outputs:
        kl = kl / len(outputs)
    loss = -reward_weight * reward_mean + kl_coef * kl
    return loss, {"reward": reward_mean.item(), "kl": kl.item(), "loss": loss.item()}


def dmd_generator_loss(
    generated: torch.Tensor,
    real_x0: torch.Tensor,
    fake_x0: torch.Tensor,
    *,
    normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The distribution matching gradient, as a loss on the generator's images.

    At a noised generator sample, ``score_fake - score_real`` is proportional to ``fake_x0 - real_x0`` (the two
    models' clean-image predictions). Descending it moves samples towards where the teacher (real score) puts mass
    and away from where the generator already is (fake score). With ``normalize``, each sample's gradient is divided
    by ``mean |generated - real_x0|`` (the DMD paper's weighting). The loss ``0.5 * mean((x - sg(x - g))^2)`` has
    gradient ``g / numel`` with respect to ``generated``.
    """
    if not (generated.shape == real_x0.shape == fake_x0.shape):
        raise ConfigError(
            f"generated {tuple(generated.shape)}, real_x0 {tuple(real_x0.shape)} and fake_x0 "
            f"{tuple(fake_x0.shape)} must have one shape"
        )
    with torch.no_grad():
        grad = (fake_x0 - real_x0).float()
        if normalize:
            scale = (generated.detach().float() - real_x0.float()).abs().flatten(1).mean(dim=1).clamp(min=eps)
            grad = grad / scale.reshape(-1, *([1] * (grad.dim() - 1)))
        grad = torch.nan_to_num(grad)
        target = generated.detach().float() - grad
    return 0.5 * (generated.float() - target).pow(2).mean()


def dmd_fake_score_loss(
    process: NoiseProcess, output: torch.Tensor, generated: torch.Tensor, noise: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """The fake score model's denoising loss on (detached) generator samples: it tracks the generator's distribution."""
    return denoising_loss(process, output, generated.detach(), noise, t)


def ode_student_timesteps(teacher_timesteps: torch.Tensor, student_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's ``student_steps + 1`` timesteps as a subset of the teacher's, and their indices.

    The student's boundaries are the teacher's nearest to an even split, so the teacher's trajectory gives exact
    targets at every student boundary (no second solve with a different step count).
    """
    teacher_steps = len(teacher_timesteps) - 1
    if not 1 <= student_steps <= teacher_steps:
        raise ConfigError(f"student_steps={student_steps} must lie in [1, {teacher_steps}] (the teacher's steps)")
    index = torch.round(torch.linspace(0, teacher_steps, student_steps + 1, dtype=torch.float64)).long()
    return teacher_timesteps[index], index


def ode_distill_loss(
    process: NoiseProcess,
    output: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    t_next: torch.Tensor,
    target_next: torch.Tensor,
) -> torch.Tensor:
    """One student step from the teacher's state ``x_t`` at ``t`` should land on the teacher's state at ``t_next``.

    ``output`` is the student's prediction at ``(x_t, t)``; the loss is the MSE between the student's DDIM/Euler
    step and ``target_next`` (the teacher trajectory, solved with many steps, at ``t_next``).
    """
    return regression_loss(ddim_step(process, x_t, output, t, t_next), target_next)
