"""The diffusion role workers: a diffusers model behind a strategy (``model_kind: diffusion``), called through
``strategy.forward_model`` / ``train_model_step`` with the step losses of :mod:`roll.pipelines.diffusion.steps`.

Random draws (noise, timesteps) come in the batch from the driver, so a step is the same on any number of ranks.
Each loss is the micro-batch's share of the mini-batch loss (its mean times rows / ``scale.num_seqs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from roll.pipelines.algorithms.diffusion import (
    NoiseProcess,
    add_noise,
    denoising_target,
    dmd_generator_loss,
    noise_process_from_scheduler,
    predicted_x0_and_noise,
    regression_loss,
    sample_ode,
)
from roll.pipelines.diffusion.steps import generator_sample, ode_distill_step, pretrain_step, reward_fl_step
from roll.pipelines.rewards.image_worker import ImageRewardSettings
from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.strategies import LossScale, ModelCall, StrategyWorker

__all__ = [
    "DiffusionPretrainWorker",
    "DiffusionSettings",
    "DiffusionTrainWorker",
    "DiffusionWorker",
    "RewardFLSettings",
    "RewardFLWorker",
    "SampleRequest",
]

Metrics = dict[str, float]


@dataclass(frozen=True)
class DiffusionSettings:
    """Every diffusion worker's settings: the folder of its noise scheduler (its model's) and the image size."""

    scheduler_path: str | None
    image_size: int


@dataclass(frozen=True)
class RewardFLSettings(DiffusionSettings):
    """The Reward-FL actor: its differentiable reward, sampler and regulariser (the reference is its start model)."""

    reward: ImageRewardSettings
    sample_steps: int
    grad_steps: int
    kl_coef: float
    reward_weight: float


@dataclass(frozen=True)
class SampleRequest:
    """A deterministic sampler run: its ``timesteps`` (decreasing, ending at 0); with ``keep`` the states at those
    indices of the trajectory are returned too (``states``: (B, len(keep), C, H, W)); ``clamp`` to [-1, 1]."""

    timesteps: tuple[float, ...]
    keep: tuple[int, ...] | None = None
    clamp: bool = True

    def __post_init__(self) -> None:
        if len(self.timesteps) < 2:
            raise ConfigError(f"a sampler needs at least 2 timesteps (1 step), got {self.timesteps}")
        if self.keep is not None and any(not 0 <= i < len(self.timesteps) for i in self.keep):
            raise ConfigError(f"keep={self.keep} must index the {len(self.timesteps)} timesteps")


def _share(loss: torch.Tensor, micro: DataProto, scale: LossScale) -> torch.Tensor:
    return loss * (len(micro) / scale.num_seqs)


class DiffusionWorker(StrategyWorker):
    """A diffusion model for forward passes: sampling, clean-image predictions, held-out denoising losses."""

    settings: DiffusionSettings
    process: NoiseProcess

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        from roll.strategies.diffusion import load_scheduler

        if not isinstance(settings, DiffusionSettings):
            raise ConfigError(f"{type(self).__name__}.initialize needs DiffusionSettings, got {type(settings)}")
        super().initialize(settings)
        self.settings = settings
        self.process = noise_process_from_scheduler(load_scheduler(settings.scheduler_path or ""))

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def sample(self, batch: DataProto, request: SampleRequest) -> DataProto:
        """``images`` from ``noise`` and ``class_labels`` (and ``states`` when ``request.keep`` is set)."""
        timesteps = torch.tensor(request.timesteps, dtype=torch.float32)

        def run(micro: DataProto, call: ModelCall) -> dict[str, torch.Tensor]:
            noise, labels = micro.batch["noise"], micro.batch["class_labels"]
            result = sample_ode(
                call, noise, labels, self.process, timesteps.to(noise.device), record_trajectory=bool(request.keep)
            )
            images = result.sample.clamp(-1.0, 1.0) if request.clamp else result.sample
            out = {"images": images}
            if request.keep:
                out["states"] = torch.stack([result.trajectory[i] for i in request.keep], dim=1)
            return out

        return DataProto.from_dict(self.strategy.forward_model(batch, run))

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def predict_x0(self, batch: DataProto) -> DataProto:
        """``x0``: the model's clean-image prediction for ``x_t`` at ``timesteps`` with ``class_labels``."""

        def run(micro: DataProto, call: ModelCall) -> dict[str, torch.Tensor]:
            x_t, t, labels = micro.batch["x_t"], micro.batch["timesteps"], micro.batch["class_labels"]
            x0, _ = predicted_x0_and_noise(self.process, call(x_t, t, labels), x_t, t)
            return {"x0": x0}

        return DataProto.from_dict(self.strategy.forward_model(batch, run))

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def denoising_losses(self, batch: DataProto) -> DataProto:
        """``loss`` (B,): each row's denoising MSE for ``images`` noised with ``noise`` at ``timesteps``."""

        def run(micro: DataProto, call: ModelCall) -> dict[str, torch.Tensor]:
            images, labels = micro.batch["images"], micro.batch["class_labels"]
            noise, t = micro.batch["noise"], micro.batch["timesteps"]
            output = call(add_noise(self.process, images, noise, t), t, labels)
            target = denoising_target(self.process, images, noise, t)
            return {"loss": (output.float() - target.float()).pow(2).flatten(1).mean(dim=1)}

        return DataProto.from_dict(self.strategy.forward_model(batch, run))


class DiffusionTrainWorker(DiffusionWorker):
    """A trained diffusion model: denoising (DMD's fake score), ODE distillation and DMD generator steps."""

    def _train(self, batch: DataProto, loss_of: Any) -> DataProto:
        def loss_func(micro: DataProto, call: ModelCall, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
            loss, metrics = loss_of(micro, call)
            return _share(loss, micro, scale), metrics

        return DataProto(meta_info={"metrics": self.train_strategy.train_model_step(batch, loss_func)})

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_denoising(self, batch: DataProto) -> DataProto:
        """Denoising loss on ``images`` (e.g. generator samples for DMD's fake score) with the batch's draws."""
        return self._train(batch, lambda micro, call: pretrain_step(call, self.process, micro.batch))

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_ode(self, batch: DataProto) -> DataProto:
        """One student step from teacher state ``x_t`` should reach ``target_next`` (see ode_distill_step)."""
        return self._train(batch, lambda micro, call: ode_distill_step(call, self.process, micro.batch))

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_dmd_generator(self, batch: DataProto, regression_weight: float, student_steps: int = 1) -> DataProto:
        """The ``student_steps``-step generator's DMD loss from ``noise`` (gradients through its last step), given
        the real and fake scores' ``real_x0``/``fake_x0`` at its noised samples (computed by those roles), plus
        ``regression_weight`` x MSE of ``reg_noise`` -> ``reg_target`` (teacher outputs)."""

        def loss_of(micro: DataProto, call: ModelCall) -> tuple[torch.Tensor, Metrics]:
            rows = micro.batch
            generated = generator_sample(call, self.process, rows["noise"], rows["class_labels"], student_steps)
            loss = dmd_generator_loss(generated, rows["real_x0"], rows["fake_x0"])
            metrics = {"dmd_loss": loss.item()}
            if regression_weight > 0:
                reg_images = generator_sample(call, self.process, rows["reg_noise"], rows["reg_labels"], student_steps)
                reg = regression_loss(reg_images, rows["reg_target"])
                loss = loss + regression_weight * reg
                metrics["regression_loss"] = reg.item()
            return loss, metrics

        return self._train(batch, loss_of)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly FSDP2-sharded) parameter, sharing its storage."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class DiffusionPretrainWorker(DiffusionTrainWorker):
    """Denoising pretraining with an exponential moving average (EMA) of the weights, kept shard by shard.

    The EMA is the model the recipe evaluates and exports: :meth:`swap_ema` exchanges it with the trained weights
    (twice restores them, bit for bit), so sampling, held-out losses and the export run on it unchanged. It is
    saved with each checkpoint (``ema/rank_<r>.pt``).
    """

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        super().initialize(settings)
        with torch.no_grad():
            self.ema = [_local(p.detach()).clone() for p in self._parameters()]
        self.ema_swapped = False

    def _parameters(self) -> list[torch.Tensor]:
        """The model's parameters, resharded first (a forward pass may leave the root's gathered)."""
        from torch.distributed.fsdp import FSDPModule

        model = getattr(self.train_strategy, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"{self.worker_name}: {self.strategy.strategy_name} holds no torch model; use fsdp2_train"
            )
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return list(model.parameters())

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_pretrain(self, batch: DataProto, ema_decay: float) -> DataProto:
        """One optimizer step of the denoising loss on the batch's draws, then ``ema = lerp(ema, w, 1 - ema_decay)``."""
        if self.ema_swapped:
            raise ConfigError("train_pretrain called while the EMA weights are swapped in; call swap_ema() first")
        out = self._train(batch, lambda micro, call: pretrain_step(call, self.process, micro.batch))
        with torch.no_grad():
            for average, param in zip(self.ema, self._parameters(), strict=True):
                average.lerp_(_local(param.detach()), 1.0 - ema_decay)
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def swap_ema(self) -> bool:
        """Exchange the model's weights with the EMA; returns True when the EMA is now in the model."""
        with torch.no_grad():
            for average, param in zip(self.ema, self._parameters(), strict=True):
                local = _local(param.detach())
                held = local.clone()
                local.copy_(average)
                average.copy_(held)
        self.ema_swapped = not self.ema_swapped
        return self.ema_swapped

    def _ema_file(self, path: str) -> Path:
        return Path(path) / "ema" / f"rank_{self.rank}.pt"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        if self.ema_swapped:
            raise ConfigError("save_checkpoint called while the EMA weights are swapped in; call swap_ema() first")
        super().save_checkpoint(path)
        file = self._ema_file(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"world_size": self.world_size, "ema": self.ema}, file)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        super().load_checkpoint(path)
        file = self._ema_file(path)
        if not file.is_file():
            raise ConfigError(f"{file} is missing: the checkpoint has no EMA for rank {self.rank}")
        saved = torch.load(file, weights_only=True)
        if saved["world_size"] != self.world_size:
            raise ConfigError(
                f"{file} holds the EMA shards of {saved['world_size']} ranks, this role has {self.world_size}; "
                "resume with the world_size the checkpoint was written with"
            )
        with torch.no_grad():
            for average, stored in zip(self.ema, saved["ema"], strict=True):
                average.copy_(stored)


class RewardFLWorker(DiffusionTrainWorker):
    """The Reward-FL actor: its reward model and its frozen start model (the regulariser's reference) live here,
    because both sit inside the differentiated sampler."""

    settings: RewardFLSettings

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        from roll.pipelines.rewards.image import build_image_reward
        from roll.strategies.diffusion import load_diffusion_model
        from roll.strategies.diffusion._strategy import device_call

        if not isinstance(settings, RewardFLSettings):
            raise ConfigError(f"RewardFLWorker.initialize needs RewardFLSettings, got {type(settings)}")
        super().initialize(settings)
        device = self.strategy.device
        reference = load_diffusion_model(self.strategy.model_args.model_name_or_path or "", train=False).to(device)
        self.reference_call = device_call(reference, device)
        reward = settings.reward
        self.reward_model = build_image_reward(reward.reward_type, reward.reward_kwargs).to(device)
        self.reward_model.requires_grad_(False)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train_reward_fl(self, batch: DataProto) -> DataProto:
        """Sample from ``noise``/``class_labels`` with gradients through the last steps and ascend the reward."""
        s = self.settings

        def loss_of(micro: DataProto, call: ModelCall) -> tuple[torch.Tensor, Metrics]:
            return reward_fl_step(
                call,
                self.reference_call,
                self.reward_model,
                self.process,
                micro.batch,
                num_steps=s.sample_steps,
                grad_steps=s.grad_steps,
                kl_coef=s.kl_coef,
                reward_weight=s.reward_weight,
            )

        return self._train(batch, loss_of)
