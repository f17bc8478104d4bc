"""Differentiable image rewards for diffusion fine-tuning (Reward-FL) and evaluation.

Every reward is an ``nn.Module`` mapping images (B, 3, H, W) in [-1, 1] and class labels (B,) to a (B,) float
tensor, differentiable with respect to the images; ``scored(images, labels)`` also returns its components
(name -> (B,)) for logging. Two kinds (``IMAGE_REWARDS`` names):

* ``"analytic"`` (:class:`AnalyticImageReward`): a weighted sum of ``brightness`` (mean luminance), ``presence``
  (soft fraction of foreground pixels) and ``colour`` (soft fraction of pixels near the prompt's colour);
* ``"classifier"`` (:class:`ClassifierReward`): the probability that a small trained classifier
  (:func:`train_shape_classifier`) gives to the prompt's class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from roll.pipelines.data.shapes import COLOURS, NUM_CONDITIONS
from roll.runtime import ConfigError, Registry

__all__ = [
    "ANALYTIC_TERMS",
    "IMAGE_REWARDS",
    "AnalyticImageReward",
    "ClassifierReward",
    "ShapeClassifier",
    "brightness",
    "build_image_reward",
    "colour_match",
    "load_shape_classifier",
    "presence",
    "save_shape_classifier",
    "train_shape_classifier",
]

_LUMA = (0.299, 0.587, 0.114)
# colour index of each class label (label = shape * len(COLOURS) + colour)
_PROMPT_COLOURS = torch.tensor(list(COLOURS.values()), dtype=torch.float32)


def _unit(images: torch.Tensor) -> torch.Tensor:
    return ((images.float() + 1.0) / 2.0).clamp(0.0, 1.0)


def brightness(images: torch.Tensor) -> torch.Tensor:
    """(B,) mean luminance in [0, 1]."""
    luma = torch.tensor(_LUMA, device=images.device).reshape(1, 3, 1, 1)
    return (_unit(images) * luma).sum(dim=1).flatten(1).mean(dim=1)


def presence(images: torch.Tensor, *, threshold: float = 0.3, softness: float = 0.05) -> torch.Tensor:
    """(B,) soft fraction of foreground pixels (brightest channel above ``threshold``)."""
    peak = _unit(images).amax(dim=1)
    return torch.sigmoid((peak - threshold) / softness).flatten(1).mean(dim=1)


def colour_match(images: torch.Tensor, target_rgb: torch.Tensor, *, width: float = 0.2) -> torch.Tensor:
    """(B,) soft fraction of pixels within about ``width`` (RGB distance in [0, 1] units) of ``target_rgb`` (B, 3)."""
    dist2 = (_unit(images) - target_rgb.to(images.device).reshape(-1, 3, 1, 1)).pow(2).sum(dim=1)
    return torch.exp(-dist2 / (2 * width**2)).flatten(1).mean(dim=1)


ANALYTIC_TERMS = ("brightness", "presence", "colour")


class AnalyticImageReward(nn.Module):
    """``sum_k weight_k * term_k(images)``; ``colour`` targets the colour named by each row's class label."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        super().__init__()
        weights = dict(weights or {"brightness": 1.0})
        unknown = sorted(set(weights) - set(ANALYTIC_TERMS))
        if unknown or not weights:
            raise ConfigError(f"unknown analytic reward terms {unknown}; choose weights for {list(ANALYTIC_TERMS)}")
        self.weights = weights

    def components(self, images: torch.Tensor, class_labels: torch.Tensor | None) -> dict[str, torch.Tensor]:
        out = {}
        for name in self.weights:
            if name == "brightness":
                out[name] = brightness(images)
            elif name == "presence":
                out[name] = presence(images)
            else:
                if class_labels is None:
                    raise ConfigError("the 'colour' reward term needs class labels (the prompt's colour)")
                out[name] = colour_match(images, _PROMPT_COLOURS.to(images.device)[class_labels % len(COLOURS)])
        return out

    def scored(
        self, images: torch.Tensor, class_labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The (B,) reward and its components."""
        parts = self.components(images, class_labels)
        return torch.stack([self.weights[name] * value for name, value in parts.items()]).sum(dim=0), parts

    def forward(self, images: torch.Tensor, class_labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.scored(images, class_labels)[0]


class ShapeClassifier(nn.Module):
    """A small CNN over (3, H, W) images in [-1, 1] predicting one of ``num_classes`` conditions."""

    def __init__(self, num_classes: int = NUM_CONDITIONS, width: int = 32) -> None:
        super().__init__()
        self.config = {"num_classes": num_classes, "width": width}
        # Max-pooling keeps the position-independent evidence of edges and corners that tells shapes apart.
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.SiLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.SiLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.SiLU(),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.float())


def train_shape_classifier(
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    steps: int = 300,
    batch_size: int = 128,
    lr: float = 3e-3,
    noise_std: float = 0.1,
    seed: int = 0,
) -> ShapeClassifier:
    """Train :class:`ShapeClassifier` on ``images`` (N, 3, H, W) / ``labels`` (N,). Small Gaussian noise on the inputs
    makes it tolerant of the slight noise left in generated images."""
    generator = torch.Generator().manual_seed(seed)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = ShapeClassifier(num_classes=NUM_CONDITIONS)
    torch.random.set_rng_state(state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    model.train()
    for _ in range(steps):
        index = torch.randint(0, images.shape[0], (batch_size,), generator=generator)
        x = images[index] + noise_std * torch.randn(images[index].shape, generator=generator)
        loss = nn.functional.cross_entropy(model(x), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval().requires_grad_(False)
    return model


def save_shape_classifier(model: ShapeClassifier, path: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` to ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"class": "ShapeClassifier", **model.config}))
    return path


def load_shape_classifier(path: str | Path) -> ShapeClassifier:
    """A frozen classifier written by :func:`save_shape_classifier`."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{path} holds no shape classifier (config.json missing); train one with train_shape_classifier"
        )
    config = json.loads((path / "config.json").read_text())
    config.pop("class", None)
    model = ShapeClassifier(**config)
    model.load_state_dict(load_file(path / "model.safetensors"))
    return model.eval().requires_grad_(False)


class ClassifierReward(nn.Module):
    """The classifier's probability of each row's prompt class (B,), in [0, 1]."""

    def __init__(self, classifier: ShapeClassifier) -> None:
        super().__init__()
        self.classifier = classifier.eval().requires_grad_(False)

    def components(self, images: torch.Tensor, class_labels: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if class_labels is None:
            raise ConfigError("the classifier reward needs class labels (the prompt's class)")
        probs = self.classifier(images).softmax(dim=-1)
        return {"class_prob": probs.gather(1, class_labels.reshape(-1, 1).to(probs.device)).squeeze(1)}

    def scored(
        self, images: torch.Tensor, class_labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The (B,) reward and its components."""
        parts = self.components(images, class_labels)
        return parts["class_prob"], parts

    def forward(self, images: torch.Tensor, class_labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.scored(images, class_labels)[0]


def _analytic(weights: Mapping[str, float] | None = None) -> AnalyticImageReward:
    return AnalyticImageReward(weights)


def _classifier(path: str | None = None) -> ClassifierReward:
    if not path:
        raise ConfigError("the 'classifier' image reward needs 'path' (a folder written by save_shape_classifier)")
    return ClassifierReward(load_shape_classifier(path))


# name -> builder(**kwargs) of a reward module
IMAGE_REWARDS: Registry[Any] = Registry("image reward", entry_point_group="roll.image_rewards")
IMAGE_REWARDS.register("analytic", _analytic)
IMAGE_REWARDS.register("classifier", _classifier)


def build_image_reward(name: str, kwargs: Mapping[str, Any] | None = None) -> nn.Module:
    """The reward module registered as ``name`` built with ``kwargs`` (analytic: ``weights``; classifier: ``path``)."""
    builder = IMAGE_REWARDS.get(name)
    try:
        return builder(**dict(kwargs or {}))
    except TypeError as e:
        raise ConfigError(f"image reward {name!r}: bad arguments {sorted(kwargs or {})} ({e})") from e
