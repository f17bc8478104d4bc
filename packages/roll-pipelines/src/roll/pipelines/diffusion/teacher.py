"""The in-process reference of the ``diffusion-pretrain-tiny`` recipe: the same teacher training in one process,
with no Ray and no strategy (used by the in-process experiments in ``tools/diffusion`` and by the test that the
``diffusion_pretrain`` pipeline trains exactly this teacher).

Both draw their batches with :func:`~roll.pipelines.diffusion.steps.pretrain_batch`, take the loss of
:func:`~roll.pipelines.diffusion.steps.pretrain_step`, and average with
:func:`~roll.pipelines.diffusion.steps.ema_decay_at`; the order per step is the same: loss, backward, clip, AdamW
step, EMA update. Recipes name their teacher ``recipe://diffusion-pretrain-tiny`` (the pipeline, cached by the
launcher), never this function.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import time
from pathlib import Path

import torch
from pydantic import Field

from roll.pipelines.algorithms.diffusion import denoising_eval_loss, noise_process_from_scheduler
from roll.pipelines.data.shapes import shape_dataset
from roll.pipelines.diffusion.steps import ema_decay_at, ema_update, pretrain_batch, pretrain_step
from roll.runtime import RollModel

__all__ = ["PretrainSettings", "pretrain_teacher"]

logger = logging.getLogger(__name__)


class PretrainSettings(RollModel):
    """Settings of the tiny teacher (the defaults are the ``diffusion-pretrain-tiny`` recipe's)."""

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
        batch = pretrain_batch(train.images, train.class_labels, process, settings.batch_size, generator)
        loss, metrics = pretrain_step(model_fn, process, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        ema_update(ema, model, ema_decay_at(step, settings.ema_decay))
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
