"""Quality measures for diffusion models: the denoising loss on held-out images at fixed noise, and distances
between sample and data distributions (MMD and a Frechet distance) on features of a fixed random conv net."""

from __future__ import annotations

import torch
from torch import nn

from roll.pipelines.algorithms.diffusion._losses import _per_sample_mse
from roll.pipelines.algorithms.diffusion._process import NoiseProcess, add_noise, denoising_target
from roll.pipelines.algorithms.diffusion._sampling import Denoiser
from roll.runtime.errors import ConfigError

__all__ = [
    "denoising_eval_loss",
    "frechet_distance",
    "image_features",
    "median_bandwidth",
    "mmd_rbf",
    "random_feature_net",
]


def random_feature_net(seed: int = 0, *, in_channels: int = 3, width: int = 32) -> nn.Module:
    """A frozen, randomly initialised conv net (a fixed function of ``seed``) whose features feed the distances.

    Two 3x3 conv + ReLU + 2x2 average-pool stages; features are the second stage's channel means and its 2x2
    average-pooled map, so colour, shape and position all show. Random conv features separate image distributions
    well enough for comparisons within one experiment; they are not comparable with Inception-based FID.
    """
    generator = torch.Generator().manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
    )
    for module in net:
        if isinstance(module, nn.Conv2d):
            fan_in = module.in_channels * 9
            module.weight.data = torch.randn(module.weight.shape, generator=generator) * (2.0 / fan_in) ** 0.5
            if module.bias is not None:
                module.bias.data = torch.randn(module.bias.shape, generator=generator) * 0.1
    net.requires_grad_(False)
    return net.eval()


@torch.no_grad()
def image_features(net: nn.Module, images: torch.Tensor, *, batch_size: int = 512) -> torch.Tensor:
    """(N, D) float64 features of ``images`` (N, C, H, W) in [-1, 1]."""
    chunks = []
    for start in range(0, images.shape[0], batch_size):
        maps = net(images[start : start + batch_size].float())
        pooled = nn.functional.adaptive_avg_pool2d(maps, 2).flatten(1)
        chunks.append(torch.cat([maps.mean(dim=(2, 3)), pooled], dim=1))
    return torch.cat(chunks).double()


def median_bandwidth(features: torch.Tensor) -> float:
    """The median pairwise Euclidean distance within ``features``: a kernel width fixed by the reference data."""
    dist = torch.cdist(features, features)
    upper = dist[torch.triu(torch.ones_like(dist, dtype=torch.bool), diagonal=1)]
    return float(upper.median())


def mmd_rbf(
    x: torch.Tensor, y: torch.Tensor, bandwidth: float, *, scales: tuple[float, ...] = (0.5, 1.0, 2.0)
) -> float:
    """Unbiased squared maximum mean discrepancy between feature sets ``x`` (N, D) and ``y`` (M, D).

    The kernel is a sum of Gaussians ``exp(-d^2 / (2 (c * bandwidth)^2))`` over ``scales`` c. Keep ``bandwidth``
    fixed across the comparisons of one experiment (e.g. :func:`median_bandwidth` of the data features). Can be
    slightly negative when the two sets come from one distribution.
    """
    if x.shape[0] < 2 or y.shape[0] < 2 or x.shape[1] != y.shape[1]:
        raise ConfigError(
            f"mmd_rbf needs two (N >= 2, D) feature sets of equal D, got {tuple(x.shape)}, {tuple(y.shape)}"
        )
    if bandwidth <= 0:
        raise ConfigError(f"bandwidth must be > 0, got {bandwidth}")
    x, y = x.double(), y.double()

    def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        d2 = torch.cdist(a, b).pow(2)
        return torch.stack([torch.exp(-d2 / (2 * (c * bandwidth) ** 2)) for c in scales]).sum(dim=0)

    n, m = x.shape[0], y.shape[0]
    kxx, kyy, kxy = kernel(x, x), kernel(y, y), kernel(x, y)
    term_x = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
    term_y = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    return float(term_x + term_y - 2 * kxy.mean())


def _sqrt_psd(matrix: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(matrix)
    return (vectors * values.clamp(min=0).sqrt()) @ vectors.T


def frechet_distance(x: torch.Tensor, y: torch.Tensor) -> float:
    """``|mu_x - mu_y|^2 + tr(C_x + C_y - 2 (C_x^1/2 C_y C_x^1/2)^1/2)`` between Gaussians fitted to ``x`` and ``y``.

    The FID formula on any features. Biased upwards for small N: compare values computed with the same N.
    """
    if x.shape[0] < 2 or y.shape[0] < 2 or x.shape[1] != y.shape[1]:
        raise ConfigError(
            f"frechet_distance needs two (N >= 2, D) feature sets, got {tuple(x.shape)}, {tuple(y.shape)}"
        )
    x, y = x.double(), y.double()
    mu_x, mu_y = x.mean(0), y.mean(0)
    cov_x, cov_y = torch.cov(x.T), torch.cov(y.T)
    root_x = _sqrt_psd(cov_x)
    cross = torch.linalg.eigvalsh(root_x @ cov_y @ root_x).clamp(min=0).sqrt().sum()
    return float((mu_x - mu_y).pow(2).sum() + cov_x.trace() + cov_y.trace() - 2 * cross)


@torch.no_grad()
def denoising_eval_loss(
    model_fn: Denoiser,
    images: torch.Tensor,
    class_labels: torch.Tensor | None,
    process: NoiseProcess,
    *,
    num_levels: int = 8,
    seed: int = 0,
    batch_size: int = 256,
) -> dict[str, float]:
    """The denoising loss of ``model_fn`` on ``images`` at ``num_levels`` evenly spaced noise levels, with noise
    drawn from ``seed``: the same (image, level, noise) triples every call, so values compare across checkpoints.

    Returns ``{"loss": mean over levels, "loss@<level>": per level}`` where level is the fraction t/T.
    """
    if num_levels < 1:
        raise ConfigError(f"num_levels must be >= 1, got {num_levels}")
    total = process.num_train_timesteps
    # Level midpoints in (0, 1): avoids t = 0 (nothing to denoise) and the end of the range.
    levels = [(k + 0.5) / num_levels for k in range(num_levels)]
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(images.shape, generator=generator).to(images.device, images.dtype)
    results: dict[str, float] = {}
    for level in levels:
        value = level * total if process.kind == "flow" else float(int(level * total))
        errors = []
        for start in range(0, images.shape[0], batch_size):
            x0, eps = images[start : start + batch_size], noise[start : start + batch_size]
            labels = None if class_labels is None else class_labels[start : start + batch_size]
            t = torch.full((x0.shape[0],), value, device=images.device)
            output = model_fn(add_noise(process, x0, eps, t), t, labels)
            errors.append(_per_sample_mse(output, denoising_target(process, x0, eps, t)))
        results[f"loss@{level:.3f}"] = float(torch.cat(errors).mean())
    results["loss"] = sum(results[f"loss@{level:.3f}"] for level in levels) / num_levels
    return results
