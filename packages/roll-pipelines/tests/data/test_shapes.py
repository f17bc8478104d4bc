"""The coloured-shapes dataset: rendering, conditions, determinism and leak-free splits."""

from __future__ import annotations

import pytest
import torch

from roll.pipelines.data import DataError
from roll.pipelines.data.shapes import (
    COLOURS,
    HELDOUT_CONDITIONS,
    NUM_CONDITIONS,
    SHAPES,
    ShapeSpec,
    caption_of,
    condition_labels,
    conditions_of,
    render_shapes,
    shape_dataset,
    shape_specs,
)


def test_splits_partition_the_specs_without_overlap():
    splits = {name: set(shape_specs(name)) for name in ("train", "eval", "test")}
    assert (
        not splits["train"] & splits["eval"]
        and not splits["train"] & splits["test"]
        and not splits["eval"] & splits["test"]
    )
    total = sum(len(s) for s in splits.values())
    assert total == 24 * (11**2 + 9**2 + 7**2)
    assert 0.75 < len(splits["train"]) / total < 0.85
    # rendered images never coincide across train and eval either
    train = {tuple(img.flatten().tolist()) for img in render_shapes(sorted(splits["train"], key=str)[:400])}
    assert not any(tuple(img.flatten().tolist()) in train for img in render_shapes(list(splits["eval"])))
    assert {s.class_label for s in splits["eval"]} == set(range(NUM_CONDITIONS))  # every condition is evaluated


def test_heldout_conditions_leave_every_shape_and_colour_in_training():
    assert len(HELDOUT_CONDITIONS) == 6
    train_conditions = {c for c in range(NUM_CONDITIONS) if c not in HELDOUT_CONDITIONS}
    assert {conditions_of(c)[0] for c in train_conditions} == set(SHAPES)
    assert {conditions_of(c)[1] for c in train_conditions} == set(COLOURS)
    held = shape_dataset("train", conditions="heldout")
    assert set(held.class_labels.tolist()) == set(HELDOUT_CONDITIONS)
    assert not set(shape_dataset("eval", conditions="train").class_labels.tolist()) & set(HELDOUT_CONDITIONS)


def test_rendering_values_colours_and_shapes():
    circle = ShapeSpec("circle", "red", 8, 8, 4)
    image = render_shapes([circle])[0]
    assert image.shape == (3, 16, 16) and image.min() == -1.0
    assert torch.allclose(image[:, 8, 8], torch.tensor(COLOURS["red"]) * 2 - 1)  # centre: full colour
    assert torch.equal(image[:, 0, 0], torch.full((3,), -1.0))  # corner: black background
    red_area = ((image[0] + 1) / 2 / COLOURS["red"][0]).sum().item()
    assert red_area == pytest.approx(3.14159 * 16, rel=0.05)  # anti-aliased coverage ~ pi r^2
    kinds = render_shapes([ShapeSpec(s, "blue", 8, 8, 5) for s in SHAPES])
    assert len({tuple(k.flatten().tolist()) for k in kinds}) == 4
    big = render_shapes([circle], image_size=32)[0]
    assert big.shape == (3, 32, 32)
    # 32x32 is the same drawing at twice the resolution: pooled, it equals 16x16 sampled as finely
    fine = render_shapes([circle], supersample=8)[0]
    assert torch.allclose(torch.nn.functional.avg_pool2d(big[None], 2)[0], fine, atol=1e-6)
    with pytest.raises(DataError, match="multiple of 16"):
        render_shapes([circle], image_size=20)


def test_dataset_is_deterministic_and_conditions_match_captions():
    a, b = shape_dataset("eval", n=50, seed=3), shape_dataset("eval", n=50, seed=3)
    assert torch.equal(a.images, b.images) and a.captions == b.captions
    assert not torch.equal(a.images, shape_dataset("eval", n=50, seed=4).images)
    assert all(caption_of(int(label)) == caption for label, caption in zip(a.class_labels, a.captions))
    full = shape_dataset("test")
    assert len(full) == len(shape_specs("test")) and len(set(full.specs)) == len(full)
    more = shape_dataset("test", n=len(full) + 5)
    assert len(set(more.specs[: len(full)])) == len(full)  # a repeat only after every image was drawn
    with pytest.raises(DataError, match="unknown shapes split"):
        shape_dataset("dev")
    with pytest.raises(DataError, match="conditions"):
        shape_dataset("train", conditions="some")


def test_condition_labels_are_balanced_and_restricted():
    labels = condition_labels(36, seed=0, conditions="train")
    counts = torch.bincount(labels, minlength=NUM_CONDITIONS)
    assert counts[list(HELDOUT_CONDITIONS)].sum() == 0 and set(counts[counts > 0].tolist()) == {2}
    assert torch.equal(labels, condition_labels(36, seed=0, conditions="train"))
    assert condition_labels(6, conditions=[3]).tolist() == [3] * 6
    with pytest.raises(DataError, match="class label"):
        conditions_of(24)
