"""Shared set-up of the in-process diffusion learning experiments (see learning.py)."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from roll.pipelines.algorithms.diffusion import noise_process_from_scheduler
from roll.pipelines.assets import cache_dir
from roll.pipelines.diffusion import PretrainSettings, pretrain_teacher
from roll.strategies.diffusion import load_diffusion_model, load_scheduler, predict


class Clock:
    """Wall and CPU seconds since creation, and the 1-minute load average at start and now."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.load_start = time.time(), time.process_time(), os.getloadavg()[0]

    def report(self) -> dict[str, float]:
        return {
            "wall_s": round(time.time() - self.wall, 1),
            "cpu_s": round(time.process_time() - self.cpu, 1),
            "load_start": round(self.load_start, 1),
            "load_end": round(os.getloadavg()[0], 1),
        }


def teacher_dir(settings: PretrainSettings) -> Path:
    return cache_dir() / "diffusion" / f"teacher-{settings.fingerprint()}"


def load_teacher(settings: PretrainSettings, *, train: bool = False):
    """(model, process, path) of the cached teacher, training it first if needed."""
    path = pretrain_teacher(settings, teacher_dir(settings))
    return load_diffusion_model(path, train=train), noise_process_from_scheduler(load_scheduler(path)), path


def fn(model: torch.nn.Module):
    return functools.partial(predict, model)


def emit(name: str, result: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    print("RESULT " + json.dumps(result), flush=True)
