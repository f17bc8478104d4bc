"""The image reward role: a Worker that scores generated images with a reward module (``IMAGE_REWARDS``).

``compute_rewards(batch)`` (``Dispatch.DP_MP_COMPUTE``: rows split across workers, collected back in order) reads
tensors ``images`` (B, 3, H, W) float in [-1, 1] and ``class_labels`` (B,) int64, and returns float32 ``scores``
(B,) plus one float32 ``reward/<component>`` column per reward component. Reward-FL differentiates through the
same reward modules inside its actor; this role scores validation samples and logs ``val/reward``.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from roll.pipelines.rewards.image import build_image_reward
from roll.runtime import ConfigError, DataProto, Dispatch, RollModel, Worker, register

__all__ = ["ImageRewardSettings", "ImageRewardWorker"]


class ImageRewardSettings(RollModel):
    """Which reward module the role builds (a name in ``IMAGE_REWARDS``, with its keyword arguments)."""

    reward_type: str = Field(default="analytic", description="IMAGE_REWARDS name: 'analytic' or 'classifier'.")
    reward_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="analytic: {'weights': {'brightness': 1.0}}; classifier: {'path': DIR}."
    )
    batch_size: int = Field(default=256, ge=1, description="Images scored per forward pass.")


class ImageRewardWorker(Worker):
    """Scores images with the reward module its settings name (an :class:`ImageRewardSettings`, given to
    ``initialize``)."""

    def __init__(self, worker_config: Any) -> None:
        super().__init__(worker_config)
        self.settings = ImageRewardSettings()
        self.reward_model: torch.nn.Module | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, clear_cache=False)
    def initialize(self, settings: Any = None) -> None:
        super().initialize(settings)
        if settings is not None and not isinstance(settings, ImageRewardSettings):
            raise ConfigError(f"{self.worker_name}: initialize needs ImageRewardSettings, got {type(settings)}")
        self.settings = settings or ImageRewardSettings()
        self.reward_model = build_image_reward(self.settings.reward_type, self.settings.reward_kwargs)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute_rewards(self, batch: DataProto) -> DataProto:
        """``scores`` (B,) and ``reward/<component>`` (B,) float32 for ``images`` and ``class_labels``."""
        if self.reward_model is None:
            self.reward_model = build_image_reward(self.settings.reward_type, self.settings.reward_kwargs)
        keys = set(batch.batch.keys()) if batch.batch is not None else set()
        if "images" not in keys:
            raise ConfigError(f"{self.worker_name}: compute_rewards needs a tensor column 'images'; got {sorted(keys)}")
        images = batch.batch["images"]
        labels = batch.batch["class_labels"] if "class_labels" in keys else None
        if images.dim() != 4 or images.shape[1] != 3:
            raise ConfigError(f"{self.worker_name}: 'images' must be (B, 3, H, W), got {tuple(images.shape)}")
        scores: list[torch.Tensor] = []
        parts: dict[str, list[torch.Tensor]] = {}
        reward_model: Any = self.reward_model
        with torch.no_grad():
            for start in range(0, images.shape[0], self.settings.batch_size):
                chunk = images[start : start + self.settings.batch_size]
                chunk_labels = None if labels is None else labels[start : start + self.settings.batch_size]
                score, components = reward_model.scored(chunk, chunk_labels)
                scores.append(score.float())
                for name, value in components.items():
                    parts.setdefault(name, []).append(value.float())
        tensors = {"scores": torch.cat(scores) if scores else torch.zeros(0)}
        tensors.update({f"reward/{name}": torch.cat(values) for name, values in parts.items()})
        return DataProto.from_dict(tensors)
