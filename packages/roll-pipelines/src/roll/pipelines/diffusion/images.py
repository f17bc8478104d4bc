"""Image grids of samples (PNG), for ``plots/`` at each evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from roll.runtime.errors import ConfigError

__all__ = ["image_grid", "save_image_grid"]


def image_grid(images: torch.Tensor, *, nrow: int = 8, padding: int = 1, scale: int = 1) -> np.ndarray:
    """(rows*H', nrow*W', 3) uint8 grid of ``images`` (N, 3, H, W) in [-1, 1], each enlarged ``scale`` times
    (nearest neighbour) with a ``padding``-pixel grey border."""
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ConfigError(f"images must be (N, 1 or 3, H, W), got {tuple(images.shape)}")
    if nrow < 1 or scale < 1 or padding < 0:
        raise ConfigError(f"nrow and scale must be >= 1 and padding >= 0, got {nrow}, {scale}, {padding}")
    pixels = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    if pixels.shape[1] == 1:
        pixels = pixels.expand(-1, 3, -1, -1)
    array = pixels.repeat_interleave(scale, dim=2).repeat_interleave(scale, dim=3).permute(0, 2, 3, 1).numpy()
    n, h, w, _ = array.shape
    rows = (n + nrow - 1) // nrow
    grid = np.full((rows * (h + padding) + padding, nrow * (w + padding) + padding, 3), 128, dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, nrow)
        top, left = padding + r * (h + padding), padding + c * (w + padding)
        grid[top : top + h, left : left + w] = array[i]
    return grid


def save_image_grid(images: torch.Tensor, path: str | Path, *, nrow: int = 8, padding: int = 1, scale: int = 4) -> Path:
    """Write :func:`image_grid` of ``images`` as a PNG at ``path`` (parent folders created)."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image_grid(images, nrow=nrow, padding=padding, scale=scale)).save(path)
    return path
