"""Evaluation helpers shared by the diffusion recipes: batched sampling with fixed noise, and the distance of a
sample set to a reference data set on fixed random conv features."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.pipelines.algorithms.diffusion import (
    Denoiser,
    NoiseProcess,
    frechet_distance,
    image_features,
    median_bandwidth,
    mmd_rbf,
    random_feature_net,
    sample_ode,
    sampling_timesteps,
)

__all__ = ["DistributionReference", "fixed_noise", "generate"]


def fixed_noise(n: int, *, seed: int, shape: tuple[int, int, int] = (3, 16, 16)) -> torch.Tensor:
    """(n, *shape) standard normal noise from ``seed`` (CPU generator: identical on every machine)."""
    return torch.randn((n, *shape), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def generate(
    model_fn: Denoiser,
    process: NoiseProcess,
    noise: torch.Tensor,
    class_labels: torch.Tensor,
    *,
    num_steps: int,
    batch_size: int = 256,
) -> torch.Tensor:
    """Images from ``noise`` with a ``num_steps`` deterministic sampler, clamped to [-1, 1]."""
    timesteps = sampling_timesteps(process, num_steps, device=noise.device)
    chunks = [
        sample_ode(
            model_fn, noise[i : i + batch_size], class_labels[i : i + batch_size], process, timesteps
        ).sample.clamp(-1.0, 1.0)
        for i in range(0, noise.shape[0], batch_size)
    ]
    return torch.cat(chunks)


@dataclass
class DistributionReference:
    """Features of a reference image set under a fixed random net, with the MMD kernel width fixed by them."""

    net: torch.nn.Module
    features: torch.Tensor
    bandwidth: float

    @classmethod
    def from_images(cls, images: torch.Tensor, *, seed: int = 0) -> DistributionReference:
        net = random_feature_net(seed, in_channels=images.shape[1])
        features = image_features(net, images)
        return cls(net, features, median_bandwidth(features))

    def distance(self, images: torch.Tensor) -> dict[str, float]:
        """``{"fd": Frechet distance, "mmd": unbiased squared MMD}`` of ``images`` to the reference."""
        features = image_features(self.net, images)
        return {
            "fd": frechet_distance(features, self.features),
            "mmd": mmd_rbf(features, self.features, self.bandwidth),
        }
