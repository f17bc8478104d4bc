"""The ``diffusion-pretrain-tiny`` recipe in-process: train a small class-conditional teacher on the shapes data,
keep an EMA copy, and save it as a diffusers folder (model + scheduler) cached by its settings.

Part of the recipes' shared code: the pretrain pipeline's worker runs the same :func:`pretrain_step` on its
shard of each batch; this function is the single-process reference used by the experiments and tests.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

import torch
from pydantic import Field

from roll.pipelines.algorithms.diffusion import (
    denoising_eval_loss,
    noise_process_from_scheduler,
    sample_training_timesteps,
)
from roll.pipelines.cache import cache_dir
from roll.pipelines.data.shapes import shape_dataset
from roll.pipelines.diffusion.steps import ema_update, pretrain_step
from roll.runtime import ConfigError, RollModel

__all__ = ["TEACHER_SCHEME", "PretrainSettings", "pretrain_teacher", "teacher_uri_path"]

TEACHER_SCHEME = "diffusion-teacher"

logger = logging.getLogger(__name__)


class PretrainSettings(RollModel):
    """Settings of the tiny teacher (the ``diffusion-pretrain-tiny`` recipe)."""

    preset: str = Field(default="unet-nano", description="DIFFUSION_PRESETS name of the model.")
    scheduler: str = Field(default="flow", description="'flow' (rectified flow), 'ddpm' or 'ddim'.")
    prediction_type: str = Field(default="epsilon", description="vp schedulers only: 'epsilon' or 'v_prediction'.")
    image_size: int = Field(default=16, description="16 or 32.")
    steps: int = Field(default=2000, ge=1)
    batch_size: int = Field(default=32, ge=1)
    learning_rate: float = Field(default=3e-3, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    ema_decay: float = Field(default=0.999, ge=0, lt=1)
    seed: int = 0

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


def pretrain_teacher(settings: PretrainSettings, out_dir: str | Path, *, log_every: int = 100) -> Path:
    """Train the teacher and save its EMA weights to ``out_dir`` (reused when already trained with ``settings``).

    ``out_dir/roll_pretrain.json`` records the settings, the held-out denoising loss and the time taken.
    """
    from roll.strategies.diffusion import build_diffusion_model, make_scheduler, predict, save_diffusion_model

    out_dir = Path(out_dir)
    stamp = out_dir / "roll_pretrain.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("fingerprint") == settings.fingerprint():
        return out_dir
    scheduler = make_scheduler(settings.scheduler, prediction_type=settings.prediction_type)
    process = noise_process_from_scheduler(scheduler)
    train = shape_dataset("train", image_size=settings.image_size)
    model = build_diffusion_model(settings.preset, sample_size=settings.image_size, seed=settings.seed)
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    model_fn = functools.partial(predict, model)
    start_wall, start_cpu, recent = time.time(), time.process_time(), []
    for step in range(settings.steps):
        index = torch.randint(0, len(train), (settings.batch_size,), generator=generator)
        images = train.images[index]
        batch = {
            "images": images,
            "class_labels": train.class_labels[index],
            "noise": torch.randn(images.shape, generator=generator),
            "timesteps": sample_training_timesteps(process, settings.batch_size, generator=generator),
        }
        loss, metrics = pretrain_step(model_fn, process, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        # EMA warm-up: early averages would otherwise be dominated by the random initialisation.
        ema_update(ema, model, min(settings.ema_decay, (1 + step) / (10 + step)))
        recent.append(metrics["loss"])
        if log_every and (step + 1) % log_every == 0:
            logger.info("pretrain step %d: loss %.4f", step + 1, sum(recent) / len(recent))
            recent = []
    held = shape_dataset("eval", image_size=settings.image_size)
    ema.eval()
    evaluation = denoising_eval_loss(functools.partial(predict, ema), held.images, held.class_labels, process)
    record = {
        "fingerprint": settings.fingerprint(),
        "settings": settings.model_dump(),
        "heldout_denoising_loss": evaluation["loss"],
        "wall_s": round(time.time() - start_wall, 1),
        "cpu_s": round(time.process_time() - start_cpu, 1),
    }
    return save_diffusion_model(
        ema, out_dir, scheduler=scheduler, extra_files={"roll_pretrain.json": json.dumps(record, indent=1)}
    )


def teacher_uri_path(uri: str) -> Path:
    """The folder of ``diffusion-teacher://<preset>?steps=..&scheduler=..&seed=..`` (any PretrainSettings field),
    trained once with :func:`pretrain_teacher` and cached under ``<cache>/diffusion/teacher-<fingerprint>``."""
    parsed = urlparse(uri)
    if parsed.scheme != TEACHER_SCHEME:
        raise ConfigError(f"{uri!r} is not a {TEACHER_SCHEME}:// reference")
    params: dict[str, object] = dict(parse_qsl(parsed.query))
    preset = parsed.netloc or parsed.path.strip("/")
    if preset:
        params["preset"] = preset
    try:
        settings = PretrainSettings.model_validate(params)
    except ValueError as e:
        raise ConfigError(
            f"{uri!r}: bad teacher settings ({e}); fields: {sorted(PretrainSettings.model_fields)}"
        ) from e
    return pretrain_teacher(settings, cache_dir() / "diffusion" / f"teacher-{settings.fingerprint()}")
