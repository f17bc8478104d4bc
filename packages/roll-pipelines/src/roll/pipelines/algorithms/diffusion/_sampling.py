"""Deterministic samplers: one DDIM update that is also the flow-matching Euler step, and the sampling loop with
truncated backpropagation through its last K steps (Reward-FL)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from roll.pipelines.algorithms.diffusion._process import NoiseProcess, coefficients, predicted_x0_and_noise
from roll.runtime.errors import ConfigError

__all__ = ["Denoiser", "SampleOutput", "ddim_step", "sample_ode"]

# (x_t (B, C, H, W), timesteps (B,) float, class labels (B,) long or None) -> the model's raw prediction.
Denoiser = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def ddim_step(
    process: NoiseProcess, x_t: torch.Tensor, output: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor
) -> torch.Tensor:
    """Move ``x_t`` from ``t`` to ``t_next`` along the model's deterministic (eta = 0) trajectory.

    ``x_next = a(t_next) * x0_hat + s(t_next) * noise_hat``. For vp this is DDIM; for flow it equals the Euler
    step ``x_t + (sigma_next - sigma) * v``.
    """
    x0, noise = predicted_x0_and_noise(process, output, x_t, t)
    a, s = coefficients(process, t_next)
    shape = (-1, *([1] * (x_t.dim() - 1)))
    return a.reshape(shape).to(x_t.dtype) * x0 + s.reshape(shape).to(x_t.dtype) * noise


@dataclass
class SampleOutput:
    """``sample``: the final images. At each of the last ``grad_steps`` steps (in order): ``outputs`` (the model's
    predictions, part of the autograd graph), ``reference_outputs`` (a frozen model's predictions at the same
    inputs, when asked for) and ``timesteps``. ``trajectory``: ``x`` at every timestep (detached), when recorded."""

    sample: torch.Tensor
    outputs: list[torch.Tensor] = field(default_factory=list)
    reference_outputs: list[torch.Tensor] = field(default_factory=list)
    timesteps: list[torch.Tensor] = field(default_factory=list)
    trajectory: list[torch.Tensor] = field(default_factory=list)


def sample_ode(
    model_fn: Denoiser,
    noise: torch.Tensor,
    class_labels: torch.Tensor | None,
    process: NoiseProcess,
    timesteps: torch.Tensor,
    *,
    grad_steps: int = 0,
    reference_fn: Denoiser | None = None,
    record_trajectory: bool = False,
) -> SampleOutput:
    """Solve the probability-flow ODE from ``noise`` over ``timesteps`` (from :func:`sampling_timesteps`).

    The first ``n - grad_steps`` steps run without autograd; gradients flow through the last ``grad_steps`` model
    calls (and through the states between them), which is Reward-FL's truncated backpropagation. ``reference_fn``
    is called (without autograd) at those same steps, for a regulariser towards a frozen model.
    """
    num_steps = len(timesteps) - 1
    if not 0 <= grad_steps <= num_steps:
        raise ConfigError(f"grad_steps={grad_steps} must lie in [0, {num_steps}] (the number of sampling steps)")
    batch = noise.shape[0]
    out = SampleOutput(sample=noise)
    x = noise
    for i in range(num_steps):
        t = timesteps[i].expand(batch).to(noise.device)
        t_next = timesteps[i + 1].expand(batch).to(noise.device)
        if record_trajectory:
            out.trajectory.append(x.detach())
        if i < num_steps - grad_steps:
            with torch.no_grad():
                x = ddim_step(process, x, model_fn(x, t, class_labels), t, t_next)
            continue
        output = model_fn(x, t, class_labels)
        out.outputs.append(output)
        out.timesteps.append(t)
        if reference_fn is not None:
            with torch.no_grad():
                out.reference_outputs.append(reference_fn(x, t, class_labels))
        x = ddim_step(process, x, output, t, t_next)
    if record_trajectory:
        out.trajectory.append(x.detach())
    out.sample = x
    return out
