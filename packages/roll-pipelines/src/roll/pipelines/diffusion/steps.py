"""One training step of each diffusion recipe, as a loss on given models and a batch of tensors.

These are what the diffusion workers call inside ``strategy.train_step`` (and what the in-process experiments in
``tools/diffusion_learning.py`` call directly). Models enter as :data:`Denoiser` callables
(``model_fn(x_t, t, class_labels)``), so a plain module, an FSDP2-sharded one or a test double all fit. Random
draws (noise, timesteps) come in the batch, made by the driver from its seed: a step then gives the same result on
any number of data-parallel ranks. Batch fields (tensors, B rows):

* pretrain: ``images`` (B, C, H, W) in [-1, 1], ``class_labels`` (B,) int64, ``noise`` like images, ``timesteps`` (B,);
* reward_fl: ``noise``, ``class_labels``;
* dmd: ``noise``, ``class_labels``, ``dmd_noise`` (like images), ``dmd_timesteps`` (B,); for the regression term
  also ``reg_noise``, ``reg_labels``, ``reg_target`` (teacher outputs of ``reg_noise``);
* ode_distill: ``x_t``, ``timesteps``, ``next_timesteps``, ``target_next``, ``class_labels``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from roll.pipelines.algorithms.diffusion import (
    Denoiser,
    NoiseProcess,
    add_noise,
    denoising_loss,
    dmd_fake_score_loss,
    dmd_generator_loss,
    ode_distill_loss,
    ode_student_timesteps,
    predicted_x0_and_noise,
    regression_loss,
    reward_fl_loss,
    sample_ode,
    sample_training_timesteps,
    sampling_timesteps,
)
from roll.runtime.errors import ConfigError

__all__ = [
    "Batch",
    "dmd_fake_score_step",
    "dmd_generator_step",
    "ema_decay_at",
    "ema_update",
    "generator_sample",
    "ode_distill_step",
    "pretrain_batch",
    "pretrain_step",
    "reward_fl_step",
    "teacher_trajectories",
]

Batch = Mapping[str, torch.Tensor]
Metrics = dict[str, float]


def _need(batch: Batch, *keys: str) -> list[torch.Tensor]:
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ConfigError(f"the batch lacks tensor fields {missing}; it has {sorted(batch)}")
    return [batch[k] for k in keys]


def pretrain_batch(
    images: torch.Tensor,
    class_labels: torch.Tensor,
    process: NoiseProcess,
    batch_size: int,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """One pretraining batch drawn from ``generator``: ``batch_size`` rows of the dataset (with replacement), their
    noise and training timesteps, in this order (the in-process teacher and the pipeline's driver draw alike)."""
    index = torch.randint(0, images.shape[0], (batch_size,), generator=generator)
    rows = images[index]
    return {
        "images": rows,
        "class_labels": class_labels[index],
        "noise": torch.randn(rows.shape, generator=generator),
        "timesteps": sample_training_timesteps(process, batch_size, generator=generator),
    }


def ema_decay_at(update: int, decay: float) -> float:
    """The EMA decay after optimizer update ``update`` (0-based): ``decay`` with a warm-up, ``(1 + u) / (10 + u)``
    while that is lower, so early averages are not dominated by the random initialisation."""
    return min(decay, (1 + update) / (10 + update))


def pretrain_step(model_fn: Denoiser, process: NoiseProcess, batch: Batch) -> tuple[torch.Tensor, Metrics]:
    """Denoising loss on ``images`` noised with the batch's ``noise`` at ``timesteps``."""
    images, labels, noise, t = _need(batch, "images", "class_labels", "noise", "timesteps")
    output = model_fn(add_noise(process, images, noise, t), t, labels)
    loss = denoising_loss(process, output, images, noise, t)
    return loss, {"loss": loss.item()}


def reward_fl_step(
    model_fn: Denoiser,
    reference_fn: Denoiser | None,
    reward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    process: NoiseProcess,
    batch: Batch,
    *,
    num_steps: int,
    grad_steps: int,
    kl_coef: float,
    reward_weight: float = 1.0,
) -> tuple[torch.Tensor, Metrics]:
    """Sample from ``noise`` in ``num_steps`` steps (gradients through the last ``grad_steps``), score the images
    with the differentiable ``reward_fn(images, class_labels)``, and return the Reward-FL loss."""
    noise, labels = _need(batch, "noise", "class_labels")
    timesteps = sampling_timesteps(process, num_steps, device=noise.device)
    result = sample_ode(
        model_fn,
        noise,
        labels,
        process,
        timesteps,
        grad_steps=grad_steps,
        reference_fn=reference_fn if kl_coef > 0 else None,
    )
    rewards = reward_fn(result.sample.clamp(-1.0, 1.0), labels)
    return reward_fl_loss(
        rewards,
        result.outputs if kl_coef > 0 else (),
        result.reference_outputs,
        reward_weight=reward_weight,
        kl_coef=kl_coef,
    )


def generator_sample(
    model_fn: Denoiser, process: NoiseProcess, noise: torch.Tensor, labels: torch.Tensor, num_steps: int = 1
) -> torch.Tensor:
    """A few-step generator's images from ``noise``: its deterministic sampler over ``num_steps`` fixed timesteps
    (:func:`sampling_timesteps`), with gradients through the last model call only (the earlier steps run without
    autograd). One step is the model's clean-image prediction from pure noise at the first sampling timestep."""
    if num_steps == 1:
        t = sampling_timesteps(process, 1, device=noise.device)[0].expand(noise.shape[0])
        x0, _ = predicted_x0_and_noise(process, model_fn(noise, t, labels), noise, t)
        return x0
    timesteps = sampling_timesteps(process, num_steps, device=noise.device)
    return sample_ode(model_fn, noise, labels, process, timesteps, grad_steps=1).sample


def dmd_generator_step(
    generator_fn: Denoiser,
    real_fn: Denoiser,
    fake_fn: Denoiser,
    process: NoiseProcess,
    batch: Batch,
    *,
    regression_weight: float = 0.0,
    student_steps: int = 1,
) -> tuple[torch.Tensor, Metrics, torch.Tensor]:
    """The ``student_steps``-step generator's DMD loss (+ ``regression_weight`` x MSE to paired teacher outputs);
    gradients flow through the generator's last step (:func:`generator_sample`).

    Returns ``(loss, metrics, generated)``; ``generated`` (detached) feeds :func:`dmd_fake_score_step`.
    """
    noise, labels, dmd_noise, dmd_t = _need(batch, "noise", "class_labels", "dmd_noise", "dmd_timesteps")
    generated = generator_sample(generator_fn, process, noise, labels, student_steps)
    with torch.no_grad():
        noisy = add_noise(process, generated, dmd_noise, dmd_t)
        real_x0, _ = predicted_x0_and_noise(process, real_fn(noisy, dmd_t, labels), noisy, dmd_t)
        fake_x0, _ = predicted_x0_and_noise(process, fake_fn(noisy, dmd_t, labels), noisy, dmd_t)
    loss = dmd_generator_loss(generated, real_x0, fake_x0)
    metrics = {"dmd_loss": loss.item()}
    if regression_weight > 0:
        reg_noise, reg_labels, reg_target = _need(batch, "reg_noise", "reg_labels", "reg_target")
        reg = regression_loss(generator_sample(generator_fn, process, reg_noise, reg_labels, student_steps), reg_target)
        loss = loss + regression_weight * reg
        metrics["regression_loss"] = reg.item()
    metrics["loss"] = loss.item()
    return loss, metrics, generated.detach()


def dmd_fake_score_step(
    fake_fn: Denoiser,
    process: NoiseProcess,
    generated: torch.Tensor,
    labels: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
) -> tuple[torch.Tensor, Metrics]:
    """The fake score model's denoising loss on generator samples (noise and timesteps given)."""
    generated = generated.detach()
    output = fake_fn(add_noise(process, generated, noise, t), t, labels)
    loss = dmd_fake_score_loss(process, output, generated, noise, t)
    return loss, {"fake_score_loss": loss.item()}


@torch.no_grad()
def teacher_trajectories(
    teacher_fn: Denoiser,
    process: NoiseProcess,
    noise: torch.Tensor,
    labels: torch.Tensor,
    *,
    teacher_steps: int,
    student_steps: int,
    batch_size: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's ODE solution from ``noise`` in ``teacher_steps`` steps, kept at the student's boundaries.

    Returns ``(states (N, student_steps + 1, C, H, W), student timesteps (student_steps + 1,))``; ``states[:, 0]``
    is the noise and ``states[:, -1]`` the teacher's output.
    """
    teacher_t = sampling_timesteps(process, teacher_steps, device=noise.device)
    student_t, index = ode_student_timesteps(teacher_t, student_steps)
    chunks = []
    for start in range(0, noise.shape[0], batch_size):
        result = sample_ode(
            teacher_fn,
            noise[start : start + batch_size],
            labels[start : start + batch_size],
            process,
            teacher_t,
            record_trajectory=True,
        )
        chunks.append(torch.stack([result.trajectory[i] for i in index.tolist()], dim=1))
    return torch.cat(chunks), student_t


def ode_segment_batch(
    states: torch.Tensor, labels: torch.Tensor, timesteps: torch.Tensor, index: torch.Tensor, segment: torch.Tensor
) -> Batch:
    """The ODE-distillation batch of trajectories ``index`` at segments ``segment``: teacher ``states`` (N, S + 1,
    ...) at the student's ``timesteps`` (S + 1,) boundaries; one student step from each start should land on the next."""
    return {
        "x_t": states[index, segment],
        "timesteps": timesteps[segment],
        "next_timesteps": timesteps[segment + 1],
        "target_next": states[index, segment + 1],
        "class_labels": labels[index],
    }


def ode_distill_step(student_fn: Denoiser, process: NoiseProcess, batch: Batch) -> tuple[torch.Tensor, Metrics]:
    """One student step from teacher states ``x_t`` at ``timesteps`` should reach ``target_next`` at ``next_timesteps``."""
    x_t, t, t_next, target, labels = _need(batch, "x_t", "timesteps", "next_timesteps", "target_next", "class_labels")
    loss = ode_distill_loss(process, student_fn(x_t, t, labels), x_t, t, t_next, target)
    return loss, {"loss": loss.item()}


@torch.no_grad()
def ema_update(target: nn.Module, source: nn.Module, decay: float) -> None:
    """``target = decay * target + (1 - decay) * source``, parameter by parameter (buffers copied)."""
    for t_param, s_param in zip(target.parameters(), source.parameters()):
        t_param.lerp_(s_param.detach(), 1.0 - decay)
    for t_buf, s_buf in zip(target.buffers(), source.buffers()):
        t_buf.copy_(s_buf)
