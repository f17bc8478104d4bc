"""The ``diffusion_reward_fl`` pipeline: reward feedback learning on a diffusion model (ROLL's Reward-FL).

Per step: ``batch_size`` prompts (fresh noise + a training condition); the actor samples with gradients through
the last ``grad_steps`` sampler steps, scores its images with the differentiable reward and takes one optimizer
step on ``-reward + kl_coef * ||out - ref||^2`` (the reference is its frozen start model).

Evaluation (step 0, every ``eval_steps``, the end): samples from fixed noise on the *held-out* conditions, scored
by the reward role (``val/reward``), the actor's denoising loss on held-out images (``val/denoising_loss``, the
quality measure), distances of the samples to held-out images (``val/fd``, ``val/mmd``) and the relative changes
since step 0 (``val/reward_rel_change``, ``val/denoising_rel_change``).
"""

from __future__ import annotations

from typing import Any

from roll.pipelines.base import Role
from roll.pipelines.data.shapes import condition_labels
from roll.pipelines.diffusion.config import RewardFLConfig
from roll.pipelines.diffusion.pipeline import DiffusionPipeline
from roll.pipelines.diffusion.workers import RewardFLWorker
from roll.pipelines.rewards.image_worker import ImageRewardWorker
from roll.pipelines.stages import StepTimer
from roll.protocol import DataProto
from roll.runtime import Cluster

__all__ = ["RewardFLPipeline"]


class RewardFLPipeline(DiffusionPipeline):
    config_cls = RewardFLConfig
    config: RewardFLConfig
    eval_conditions = "heldout"

    def setup(self) -> None:
        cfg = self.config
        # 1. data; 2. session; 3. roles; 4. wiring
        self.prepare_data("actor_train")
        self.open_session()
        clusters = self.create_clusters(
            {
                "actor_train": Role(RewardFLWorker, cfg.actor_train, cfg.actor_settings()),
                "reward": Role(ImageRewardWorker, cfg.reward, cfg.reward_model),
            }
        )
        self.actor, self.reward = clusters["actor_train"], clusters["reward"]
        self.set_checkpoint_clusters(self.actor)

    def trained_cluster(self) -> Cluster:
        return self.actor

    def step(self, step: int) -> dict[str, Any]:
        s = self.config.reward_fl
        timer = StepTimer()
        labels = condition_labels(s.batch_size, seed=self.config.seed * 100_003 + step, conditions=s.train_conditions)
        batch = DataProto.from_dict({"noise": self.noise(s.batch_size), "class_labels": labels})
        with timer.phase("train"):
            out = self.actor.train_reward_fl(batch)
        metrics = {f"train/{k}": v for k, v in out.meta_info["metrics"].items()}
        return {**metrics, **timer.times}

    def validate(self, step: int) -> dict[str, float]:
        timesteps = self.timesteps(self.config.reward_fl.sample_steps)
        images = self.sample(self.actor, self.eval_noise, self.eval_labels, timesteps)["images"]
        scored = self.reward.compute_rewards(DataProto.from_dict({"images": images, "class_labels": self.eval_labels}))
        metrics = {"val/reward": float(scored["scores"].mean())}
        for key in scored.batch.keys():
            if key.startswith("reward/"):
                metrics[f"val/{key}"] = float(scored[key].mean())
        metrics["val/denoising_loss"] = self.denoising_quality(self.actor)
        metrics.update({f"val/{k}": v for k, v in self.reference.distance(images).items()})
        if not self.baseline:
            self.baseline = {"reward": metrics["val/reward"], "denoising_loss": metrics["val/denoising_loss"]}
        metrics["val/reward_rel_change"] = metrics["val/reward"] / self.baseline["reward"] - 1.0
        metrics["val/denoising_rel_change"] = metrics["val/denoising_loss"] / self.baseline["denoising_loss"] - 1.0
        self.save_grid("samples", step, images)
        return metrics
