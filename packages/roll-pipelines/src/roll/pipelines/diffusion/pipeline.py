"""What the diffusion pipelines share: the held-out data and fixed evaluation noise, the driver's noise process
(the scheduler of a model role) and random stream, sampler calls on a role, image grids in ``plots/``.

Each pipeline (:mod:`.reward_fl`, :mod:`.dmd`, :mod:`.ode_distill`) follows the one shape of
``docs/pipelines.md``: ``setup()`` (data, session, roles, wiring), ``step()``, ``validate()``, ``run()``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from roll.pipelines.algorithms.diffusion import NoiseProcess, noise_process_from_scheduler, sampling_timesteps
from roll.pipelines.base import BasePipeline
from roll.pipelines.data.shapes import ShapeData, condition_labels, shape_dataset
from roll.pipelines.diffusion.config import _DiffusionConfig
from roll.pipelines.diffusion.evaluation import DistributionReference, fixed_noise
from roll.pipelines.diffusion.images import save_image_grid
from roll.pipelines.diffusion.workers import SampleRequest
from roll.pipelines.stages import is_eval_step
from roll.protocol import DataProto
from roll.runtime import Cluster

__all__ = ["DiffusionPipeline"]

logger = logging.getLogger(__name__)


class DiffusionPipeline(BasePipeline):
    """Base of the diffusion pipelines; subclasses set ``eval_conditions`` and implement setup/step/validate."""

    config: _DiffusionConfig
    eval_conditions: str = "all"

    # --- setup pieces -----------------------------------------------------------------------------------
    def prepare_data(self, scheduler_role: str) -> None:
        """Held-out images and their feature reference, fixed evaluation noise and conditions, the noise process
        (from ``scheduler_role``'s model folder) and the driver's seeded random stream."""
        from roll.strategies.diffusion import load_scheduler

        cfg, ev = self.config, self.config.evaluation
        path = getattr(cfg, scheduler_role).model_args.model_name_or_path
        self.process: NoiseProcess = noise_process_from_scheduler(load_scheduler(path or ""))
        self.held: ShapeData = shape_dataset("eval", image_size=cfg.image_size)
        self.reference = DistributionReference.from_images(self.held.images)
        conditions = ev.conditions or self.eval_conditions
        self.eval_labels = condition_labels(ev.num_samples, seed=ev.condition_seed, conditions=conditions)
        self.eval_noise = self.noise(ev.num_samples, seed=ev.noise_seed)
        self.rng = torch.Generator().manual_seed(cfg.seed)
        self.baseline: dict[str, float] = {}

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (3, self.config.image_size, self.config.image_size)

    def noise(self, n: int, *, seed: int | None = None) -> torch.Tensor:
        """(n, 3, S, S) standard normal noise: from ``seed`` (fixed sets) or the driver's training stream."""
        if seed is not None:
            return fixed_noise(n, seed=seed, shape=self.image_shape)
        return torch.randn((n, *self.image_shape), generator=self.rng)

    def timesteps(self, num_steps: int) -> torch.Tensor:
        return sampling_timesteps(self.process, num_steps)

    # --- calls on roles ---------------------------------------------------------------------------------
    @staticmethod
    def sample(
        cluster: Cluster,
        noise: torch.Tensor,
        labels: torch.Tensor,
        timesteps: torch.Tensor,
        *,
        keep: list[int] | None = None,
        clamp: bool = True,
    ) -> DataProto:
        request = SampleRequest(tuple(float(t) for t in timesteps), tuple(keep) if keep else None, clamp)
        return cluster.sample(DataProto.from_dict({"noise": noise, "class_labels": labels}), request)

    def denoising_quality(self, cluster: Cluster) -> float:
        """Mean denoising loss of ``cluster``'s model on the held-out images, each at one of ``denoising_levels``
        fixed noise levels with fixed noise: the same triples at every evaluation."""
        levels = self.config.evaluation.denoising_levels
        n = len(self.held)
        fraction = (torch.arange(n) % levels + 0.5) / levels
        total = float(self.process.num_train_timesteps)
        t = fraction * total if self.process.kind == "flow" else (fraction * total).floor()
        batch = {
            "images": self.held.images,
            "class_labels": self.held.class_labels,
            "noise": fixed_noise(n, seed=self.config.evaluation.noise_seed + 1, shape=self.image_shape),
            "timesteps": t.float(),
        }
        return float(cluster.denoising_losses(DataProto.from_dict(batch))["loss"].mean())

    def save_grid(self, name: str, step: int, images: torch.Tensor) -> None:
        count = self.config.evaluation.grid_images
        if count and self.config.plots:
            save_image_grid(images[:count], self.output_dir / "plots" / f"{name}_step{step:04d}.png")

    # --- checkpoint state -------------------------------------------------------------------------------
    def data_state(self) -> dict[str, Any]:
        return {"rng": self.rng.get_state().tolist()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.rng.set_state(torch.tensor(state["rng"], dtype=torch.uint8))

    def algorithm_state(self) -> dict[str, Any]:
        return {"baseline": dict(self.baseline)}

    def load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.baseline = dict(state.get("baseline", {}))

    # --- loop -------------------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def validate(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def trained_cluster(self) -> Cluster:
        raise NotImplementedError

    def run(self) -> dict[str, float]:
        start = self.resume()
        last: dict[str, float] = {}
        if start == 0:
            last = self.log_metrics(0, self.validate(0))
        for step in self.steps(start):
            metrics = self.step(step)
            if is_eval_step(step, self.config.eval_steps, self.max_steps):
                metrics.update(self.validate(step))
            last = self.log_metrics(step, metrics)
            self.do_checkpoint(step, force=step == self.max_steps)
        if self.config.export_hf:
            self.export_hf(self.trained_cluster())
        return last
