"""Image grids, evaluation helpers and the in-process teacher recipe (a few steps, cached by settings)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roll.pipelines.algorithms.diffusion import flow_process
from roll.pipelines.data.shapes import shape_dataset
from roll.pipelines.diffusion import (
    DistributionReference,
    PretrainSettings,
    fixed_noise,
    generate,
    image_grid,
    pretrain_teacher,
    save_image_grid,
)
from roll.runtime.errors import ConfigError

pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve


def test_image_grid_layout_and_values(tmp_path):
    images = torch.full((5, 3, 4, 4), -1.0)
    images[1] = 1.0
    grid = image_grid(images, nrow=3, padding=1, scale=2)
    assert grid.shape == (2 * 9 + 1, 3 * 9 + 1, 3) and grid.dtype == np.uint8
    assert (grid[1:9, 1:9] == 0).all() and (grid[1:9, 10:18] == 255).all() and (grid[0] == 128).all()
    assert (grid[10:18, 19:27] == 128).all()  # the sixth cell is empty padding
    from PIL import Image

    path = save_image_grid(images, tmp_path / "plots" / "grid.png", nrow=5, scale=1)
    assert Image.open(path).size == (5 * 5 + 1, 4 + 2)
    with pytest.raises(ConfigError, match="images must be"):
        image_grid(torch.zeros(2, 4, 4))


def test_distribution_reference_ranks_sets_and_generate_is_deterministic():
    held = shape_dataset("eval", n=128, seed=0)
    reference = DistributionReference.from_images(held.images)
    same = reference.distance(shape_dataset("train", n=128, seed=1).images)
    noise = reference.distance(fixed_noise(128, seed=0).clamp(-1, 1))
    assert noise["fd"] > 10 * same["fd"] and noise["mmd"] > 10 * abs(same["mmd"])
    model = lambda x, t, y: x * 0.5  # noqa: E731
    a = generate(
        model, flow_process(), fixed_noise(6, seed=2), torch.zeros(6, dtype=torch.long), num_steps=3, batch_size=4
    )
    assert torch.equal(
        a, generate(model, flow_process(), fixed_noise(6, seed=2), torch.zeros(6, dtype=torch.long), num_steps=3)
    )
    assert a.abs().max() <= 1.0


def test_pretrain_teacher_saves_a_loadable_model_and_reuses_it(tmp_path):
    pytest.importorskip("diffusers")
    from roll.strategies.diffusion import load_diffusion_model, load_scheduler

    settings = PretrainSettings(steps=3, batch_size=4)
    path = pretrain_teacher(settings, tmp_path / "teacher", log_every=0)
    record = json.loads((path / "roll_pretrain.json").read_text())
    assert record["fingerprint"] == settings.fingerprint() and record["heldout_denoising_loss"] > 0
    model = load_diffusion_model(path)
    assert type(load_scheduler(path)).__name__ == "FlowMatchEulerDiscreteScheduler"
    mtime = (path / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    assert pretrain_teacher(settings, path) == path
    assert (path / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns == mtime
    assert PretrainSettings(steps=4).fingerprint() != settings.fingerprint()
    assert sum(p.numel() for p in model.parameters()) > 100_000
