"""The forward noising process of a diffusion model and conversions between what a model predicts.

Every process writes a noisy image as ``x_t = a(t) * x0 + s(t) * noise``. ``t`` is the model's timestep input, a
float tensor of shape (B,):

* ``vp`` (DDPM/DDIM, variance preserving): ``t`` is an integer index into ``alphas_cumprod`` (0 .. T-1),
  ``a = sqrt(alphas_cumprod[t])``, ``s = sqrt(1 - alphas_cumprod[t])``; ``t = -1`` means the clean image;
* ``flow`` (rectified flow / flow matching): ``t = sigma * T`` with ``sigma`` in [0, 1], ``a = 1 - sigma``,
  ``s = sigma``.

A model predicts ``epsilon`` (the noise), ``v_prediction`` (``a * noise - s * x0``, vp only) or ``flow`` (the
velocity ``noise - x0``, flow only). Diffusers schedulers are read, not called: :func:`noise_process_from_scheduler`
takes their constants, and the tests check these functions against the schedulers' own ``add_noise``/``step``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.runtime.errors import ConfigError

__all__ = [
    "PREDICTION_TYPES",
    "NoiseProcess",
    "add_noise",
    "coefficients",
    "denoising_target",
    "flow_process",
    "noise_process_from_scheduler",
    "predicted_x0_and_noise",
    "sample_training_timesteps",
    "sampling_timesteps",
    "vp_process",
]

PREDICTION_TYPES = {"vp": ("epsilon", "v_prediction"), "flow": ("flow",)}


@dataclass(frozen=True)
class NoiseProcess:
    """``kind`` ("vp" or "flow"), what the model predicts, the number of training timesteps ``T`` and, for vp,
    the (T,) cumulative product of alphas."""

    kind: str
    prediction_type: str
    num_train_timesteps: int = 1000
    alphas_cumprod: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kind not in PREDICTION_TYPES:
            raise ConfigError(f"NoiseProcess.kind={self.kind!r} is not valid; choose 'vp' or 'flow'")
        if self.prediction_type not in PREDICTION_TYPES[self.kind]:
            raise ConfigError(
                f"prediction_type={self.prediction_type!r} does not fit a {self.kind} process; "
                f"choose one of {list(PREDICTION_TYPES[self.kind])}"
            )
        if self.num_train_timesteps < 1:
            raise ConfigError(f"num_train_timesteps must be >= 1, got {self.num_train_timesteps}")
        if self.kind == "vp":
            ac = self.alphas_cumprod
            if ac is None or ac.shape != (self.num_train_timesteps,):
                raise ConfigError(f"a vp process needs alphas_cumprod of shape ({self.num_train_timesteps},)")
            if not bool(((ac > 0) & (ac <= 1)).all()):
                raise ConfigError("alphas_cumprod must lie in (0, 1]")


def vp_process(
    prediction_type: str = "epsilon",
    *,
    num_train_timesteps: int = 1000,
    beta_start: float = 1e-4,
    beta_end: float = 0.02,
) -> NoiseProcess:
    """A DDPM process with linearly spaced betas (the DDPM paper's and diffusers' default)."""
    betas = torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float64)
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).to(torch.float32)
    return NoiseProcess("vp", prediction_type, num_train_timesteps, alphas_cumprod)


def flow_process(*, num_train_timesteps: int = 1000) -> NoiseProcess:
    """A rectified-flow process (``x_t = (1 - sigma) x0 + sigma noise``, velocity prediction)."""
    return NoiseProcess("flow", "flow", num_train_timesteps)


def noise_process_from_scheduler(scheduler: object) -> NoiseProcess:
    """The process a diffusers scheduler describes (FlowMatchEulerDiscrete, DDPM or DDIM; duck-typed)."""
    config = getattr(scheduler, "config", None)
    if config is None:
        raise ConfigError(f"{type(scheduler).__name__} has no .config; pass a diffusers scheduler")
    steps = int(config["num_train_timesteps"])
    if "FlowMatch" in type(scheduler).__name__:
        if float(config.get("shift", 1.0)) != 1.0 or config.get("use_dynamic_shifting", False):
            raise ConfigError("only unshifted flow-matching schedulers are supported (shift=1, no dynamic shifting)")
        return flow_process(num_train_timesteps=steps)
    alphas_cumprod = getattr(scheduler, "alphas_cumprod", None)
    if alphas_cumprod is None:
        raise ConfigError(f"{type(scheduler).__name__} is neither a flow-matching nor an alphas_cumprod scheduler")
    return NoiseProcess("vp", str(config["prediction_type"]), steps, alphas_cumprod.detach().to(torch.float32).cpu())


def _expand(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return value.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def coefficients(process: NoiseProcess, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, s)`` of shape (B,) (float32) at timesteps ``t``."""
    t = t.to(torch.float32)
    if process.kind == "flow":
        sigma = (t / process.num_train_timesteps).clamp(0.0, 1.0)
        return 1.0 - sigma, sigma
    ac = process.alphas_cumprod.to(t.device)  # type: ignore[union-attr]
    index = t.round().long()
    if bool(((index < -1) | (index >= process.num_train_timesteps)).any()):
        raise ConfigError(f"vp timesteps must be integers in [-1, {process.num_train_timesteps - 1}]")
    alpha_bar = torch.where(index < 0, torch.ones_like(t), ac[index.clamp(min=0)])
    return alpha_bar.sqrt(), (1.0 - alpha_bar).sqrt()


def add_noise(process: NoiseProcess, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``x_t = a(t) x0 + s(t) noise``."""
    a, s = coefficients(process, t)
    return _expand(a, x0) * x0 + _expand(s, x0) * noise


def denoising_target(process: NoiseProcess, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """What the model should output for ``x_t = add_noise(x0, noise, t)``."""
    if process.prediction_type == "epsilon":
        return noise
    if process.prediction_type == "flow":
        return noise - x0
    a, s = coefficients(process, t)
    return _expand(a, x0) * noise - _expand(s, x0) * x0


def predicted_x0_and_noise(
    process: NoiseProcess, output: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clean image and the noise implied by a model ``output`` at ``(x_t, t)``."""
    a, s = (_expand(c, x_t) for c in coefficients(process, t))
    if process.prediction_type == "epsilon":
        return (x_t - s * output) / a, output
    if process.prediction_type == "v_prediction":
        return a * x_t - s * output, s * x_t + a * output
    return x_t - s * output, x_t + a * output  # flow: a = 1 - sigma, s = sigma


def sampling_timesteps(process: NoiseProcess, num_steps: int, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """``num_steps + 1`` decreasing timesteps from pure noise to the clean image (the last one).

    vp: DDIM's "trailing" spacing (``round(arange(T, 0, -T/n)) - 1``, then -1), which starts at ``T - 1`` so even
    one step starts from (nearly) pure noise; flow: ``sigma = linspace(1, 0, n + 1)``.
    """
    if num_steps < 1:
        raise ConfigError(f"num_steps must be >= 1, got {num_steps}")
    total = process.num_train_timesteps
    if process.kind == "flow":
        return torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64, device=device).float() * total
    if num_steps > total:
        raise ConfigError(f"num_steps={num_steps} exceeds the process's {total} timesteps")
    steps = torch.round(torch.arange(total, 0, -total / num_steps, dtype=torch.float64)) - 1
    return torch.cat([steps, torch.tensor([-1.0], dtype=torch.float64)]).float().to(device)


def sample_training_timesteps(
    process: NoiseProcess, batch_size: int, *, generator: torch.Generator | None = None, device: str = "cpu"
) -> torch.Tensor:
    """(B,) float timesteps drawn uniformly: integers 0..T-1 (vp) or ``sigma * T`` with ``sigma ~ U(0, 1)`` (flow)."""
    total = process.num_train_timesteps
    if process.kind == "flow":
        return torch.rand(batch_size, generator=generator, device=device) * total
    return torch.randint(0, total, (batch_size,), generator=generator, device=device).float()
