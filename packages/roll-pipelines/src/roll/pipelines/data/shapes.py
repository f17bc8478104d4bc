"""Synthetic images of coloured shapes with class and caption conditions, for the tiny diffusion recipes.

Every image is rendered from a :class:`ShapeSpec` (shape, colour, centre, half-size) on a black background,
anti-aliased by supersampling, as float RGB in [-1, 1] (16x16 or 32x32; positions live on a 16-unit grid that is
scaled to the image size). The condition is ``class_label = shape_index * len(COLOURS) + colour_index`` with the
caption ``"<colour> <shape>"``.

Two splits, both leak-free by construction:

* images: every spec belongs to exactly one of train (80%) / eval (10%) / test (10%), decided by a hash of the
  spec itself, so no rendered image appears in two splits, whatever ``n`` or ``seed`` is used. Held-out images
  show seen conditions at unseen (position, size) combinations;
* conditions: :data:`HELDOUT_CONDITIONS` (6 of the 24 shape-colour pairs, every shape and colour still seen in
  training) are for evaluating a fine-tuned model on prompts it was not tuned on (Reward-FL's ``val/reward``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np
import torch

from roll.pipelines.data.errors import DataError

__all__ = [
    "COLOURS",
    "HELDOUT_CONDITIONS",
    "NUM_CONDITIONS",
    "SHAPES",
    "ShapeData",
    "ShapeSpec",
    "caption_of",
    "condition_labels",
    "conditions_of",
    "render_shapes",
    "shape_dataset",
    "shape_specs",
]

SHAPES = ("circle", "square", "triangle", "cross")
# RGB in [0, 1]; saturated so that colour, brightness and shape differ visibly at 16x16.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.95, 0.15, 0.15),
    "green": (0.15, 0.85, 0.2),
    "blue": (0.2, 0.35, 0.95),
    "yellow": (0.95, 0.9, 0.1),
    "magenta": (0.9, 0.2, 0.9),
    "cyan": (0.1, 0.85, 0.9),
}
_COLOUR_NAMES = tuple(COLOURS)
NUM_CONDITIONS = len(SHAPES) * len(COLOURS)
# (shape + colour) % 4 == 0: one or two pairs per shape, exactly one per colour.
HELDOUT_CONDITIONS = tuple(
    s * len(COLOURS) + c for s in range(len(SHAPES)) for c in range(len(COLOURS)) if (s + c) % 4 == 0
)
_GRID = 16
_HALF_SIZES = (3, 4, 5)
_SPLITS = {"train": "train", "eval": "eval", "val": "eval", "validation": "eval", "test": "test"}


@dataclass(frozen=True)
class ShapeSpec:
    """One image: shape and colour names, centre (cx, cy) and half-size on the 16-unit grid."""

    shape: str
    colour: str
    cx: int
    cy: int
    half_size: int

    @property
    def class_label(self) -> int:
        return SHAPES.index(self.shape) * len(COLOURS) + _COLOUR_NAMES.index(self.colour)

    @property
    def caption(self) -> str:
        return f"{self.colour} {self.shape}"

    @property
    def split(self) -> str:
        key = f"{self.shape}|{self.colour}|{self.cx}|{self.cy}|{self.half_size}"
        bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 10
        return "eval" if bucket == 0 else "test" if bucket == 1 else "train"


def conditions_of(label: int) -> tuple[str, str]:
    """``(shape, colour)`` of a class label."""
    if not 0 <= label < NUM_CONDITIONS:
        raise DataError(f"class label {label} is outside 0..{NUM_CONDITIONS - 1}")
    return SHAPES[label // len(COLOURS)], _COLOUR_NAMES[label % len(COLOURS)]


def caption_of(label: int) -> str:
    shape, colour = conditions_of(label)
    return f"{colour} {shape}"


def _condition_set(conditions: str | list[int]) -> list[int]:
    if isinstance(conditions, list):
        bad = [c for c in conditions if not 0 <= c < NUM_CONDITIONS]
        if bad or not conditions:
            raise DataError(f"conditions {conditions!r} must be a non-empty list of labels in 0..{NUM_CONDITIONS - 1}")
        return sorted(set(conditions))
    if conditions == "all":
        return list(range(NUM_CONDITIONS))
    if conditions == "heldout":
        return list(HELDOUT_CONDITIONS)
    if conditions == "train":
        return [c for c in range(NUM_CONDITIONS) if c not in HELDOUT_CONDITIONS]
    raise DataError(f"conditions={conditions!r} is not valid; use 'all', 'train', 'heldout' or a list of labels")


def shape_specs(split: str = "train", conditions: str | list[int] = "all") -> list[ShapeSpec]:
    """Every spec of ``split`` whose condition is in ``conditions``, in a fixed order."""
    if split not in _SPLITS:
        raise DataError(f"unknown shapes split {split!r}; use one of {sorted(_SPLITS)}")
    split, allowed = _SPLITS[split], set(_condition_set(conditions))
    specs = []
    for shape in SHAPES:
        for colour in _COLOUR_NAMES:
            for h in _HALF_SIZES:
                for cy in range(h, _GRID - h + 1):
                    for cx in range(h, _GRID - h + 1):
                        spec = ShapeSpec(shape, colour, cx, cy, h)
                        if spec.class_label in allowed and spec.split == split:
                            specs.append(spec)
    return specs


def _coverage(spec: ShapeSpec, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    du, dv, h = u - spec.cx, v - spec.cy, float(spec.half_size)
    if spec.shape == "circle":
        inside = du**2 + dv**2 <= h**2
    elif spec.shape == "square":
        inside = (np.abs(du) <= 0.85 * h) & (np.abs(dv) <= 0.85 * h)
    elif spec.shape == "triangle":  # apex up, base at the bottom
        inside = (dv <= h) & (np.abs(du) <= (dv + h) / 2)
    else:  # cross: a plus sign with arms a third as thick as long
        inside = ((np.abs(du) <= h / 3) & (np.abs(dv) <= h)) | ((np.abs(dv) <= h / 3) & (np.abs(du) <= h))
    return inside.astype(np.float32)


def render_shapes(specs: list[ShapeSpec], image_size: int = 16, *, supersample: int = 4) -> torch.Tensor:
    """(N, 3, image_size, image_size) float32 images in [-1, 1]."""
    if image_size % _GRID:
        raise DataError(f"image_size must be a multiple of {_GRID} (16 or 32), got {image_size}")
    n = image_size * supersample
    coords = (np.arange(n, dtype=np.float32) + 0.5) * (_GRID / n)  # sub-pixel centres in grid units
    v, u = np.meshgrid(coords, coords, indexing="ij")
    out = np.empty((len(specs), 3, image_size, image_size), dtype=np.float32)
    for i, spec in enumerate(specs):
        alpha = _coverage(spec, u, v).reshape(image_size, supersample, image_size, supersample).mean(axis=(1, 3))
        colour = np.asarray(COLOURS[spec.colour], dtype=np.float32)[:, None, None]
        out[i] = alpha[None] * colour * 2.0 - 1.0
    return torch.from_numpy(out)


@dataclass
class ShapeData:
    """Images (N, 3, H, W) in [-1, 1], class labels (N,) int64, captions and the specs they were rendered from."""

    images: torch.Tensor
    class_labels: torch.Tensor
    captions: list[str]
    specs: list[ShapeSpec]

    def __len__(self) -> int:
        return len(self.specs)


def shape_dataset(
    split: str = "train",
    *,
    n: int | None = None,
    seed: int = 0,
    image_size: int = 16,
    conditions: str | list[int] = "all",
) -> ShapeData:
    """``n`` images of ``split`` (all of them when None), shuffled by ``seed``; with ``n`` above the split's size,
    whole shuffled passes repeat (an image repeats only once every image was drawn)."""
    pool = shape_specs(split, conditions)
    if not pool:
        raise DataError(f"no shapes in split {split!r} with conditions {conditions!r}")
    rng = random.Random(f"shapes:{seed}:{_SPLITS[split]}")
    count = len(pool) if n is None else n
    if count < 1:
        raise DataError(f"n must be at least 1, got {n}")
    drawn: list[ShapeSpec] = []
    while len(drawn) < count:
        epoch = list(pool)
        rng.shuffle(epoch)
        drawn.extend(epoch[: count - len(drawn)])
    return ShapeData(
        images=render_shapes(drawn, image_size),
        class_labels=torch.tensor([s.class_label for s in drawn], dtype=torch.long),
        captions=[s.caption for s in drawn],
        specs=drawn,
    )


def condition_labels(n: int, *, seed: int = 0, conditions: str | list[int] = "all") -> torch.Tensor:
    """(n,) class labels cycling through ``conditions`` in shuffled passes: balanced prompts for sampling."""
    allowed = _condition_set(conditions)
    rng = random.Random(f"conditions:{seed}")
    labels: list[int] = []
    while len(labels) < n:
        epoch = list(allowed)
        rng.shuffle(epoch)
        labels.extend(epoch[: n - len(labels)])
    return torch.tensor(labels, dtype=torch.long)
