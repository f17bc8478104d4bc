"""Image rewards: analytic terms on known images, the trained classifier reward, and the reward role on Ray."""

from __future__ import annotations

import pytest
import torch

from roll.pipelines.data.shapes import COLOURS, ShapeSpec, render_shapes, shape_dataset
from roll.pipelines.rewards.image import (
    IMAGE_REWARDS,
    AnalyticImageReward,
    ClassifierReward,
    brightness,
    build_image_reward,
    colour_match,
    load_shape_classifier,
    presence,
    save_shape_classifier,
    train_shape_classifier,
)
from roll.pipelines.rewards.image_worker import ImageRewardSettings, ImageRewardWorker
from roll.runtime import Cluster, ConfigError, DataProto, WorkerConfig


def _flat(rgb: tuple[float, float, float], n: int = 2) -> torch.Tensor:
    return (torch.tensor(rgb).reshape(1, 3, 1, 1) * 2 - 1).expand(n, 3, 8, 8).clone()


def test_analytic_terms_on_known_images():
    black, white = _flat((0, 0, 0)), _flat((1, 1, 1))
    assert brightness(black).tolist() == [0.0, 0.0] and brightness(white).tolist() == pytest.approx([1.0, 1.0])
    assert brightness(_flat((1, 0, 0))).tolist() == pytest.approx([0.299, 0.299])
    half = black.clone()
    half[:, :, :4] = 1.0  # top half white
    soft = 0.5 * (torch.sigmoid(torch.tensor(0.7 / 0.05)) + torch.sigmoid(torch.tensor(-0.3 / 0.05))).item()
    assert presence(half).tolist() == pytest.approx([soft, soft], abs=1e-6)  # ~0.5: half the pixels are on
    red = torch.tensor(COLOURS["red"])
    on_colour = colour_match(_flat(tuple(red.tolist())), red.expand(2, 3))
    assert on_colour.tolist() == pytest.approx([1.0, 1.0])
    assert colour_match(black, red.expand(2, 3)).max() < 0.01


def test_analytic_reward_weights_components_and_gradient():
    images = render_shapes([ShapeSpec("circle", "red", 8, 8, 4), ShapeSpec("square", "blue", 6, 7, 3)])
    labels = torch.tensor([0, 8])  # red circle, blue square (colour index = label % 6)
    reward = AnalyticImageReward({"brightness": 2.0, "colour": 1.0})
    score, parts = reward.scored(images, labels)
    assert torch.allclose(score, 2 * brightness(images) + parts["colour"])
    wrong_colour = reward.components(images, torch.tensor([1, 9]))["colour"]  # green prompts
    assert (parts["colour"] > wrong_colour).all()
    images.requires_grad_(True)
    reward(images, labels).sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="unknown analytic reward terms"):
        AnalyticImageReward({"sharpness": 1.0})
    with pytest.raises(ConfigError, match="class labels"):
        AnalyticImageReward({"colour": 1.0})(images)


@pytest.mark.slow
def test_classifier_recipe_generalises_to_heldout_images(tmp_path):
    train, held = shape_dataset("train"), shape_dataset("eval")
    trained = train_shape_classifier(train.images, train.class_labels, steps=400, seed=0)  # ~30 s of one core
    classifier_dir = save_shape_classifier(trained, tmp_path / "classifier")
    model = load_shape_classifier(classifier_dir)
    with torch.no_grad():
        accuracy = (model(held.images).argmax(-1) == held.class_labels).float().mean().item()
    assert accuracy > 0.9
    reward = build_image_reward("classifier", {"path": str(classifier_dir)})
    assert isinstance(reward, ClassifierReward)
    probs = reward(held.images[:64], held.class_labels[:64])
    wrong = reward(held.images[:64], (held.class_labels[:64] + 1) % 24)
    assert probs.mean() > 0.8 > 0.1 > wrong.mean()


def test_classifier_round_trips_and_registry_errors(tmp_path):
    data = shape_dataset("eval", n=32)
    quick = train_shape_classifier(data.images, data.class_labels, steps=2, batch_size=8)
    path = save_shape_classifier(quick, tmp_path / "quick")
    with torch.no_grad():
        torch.testing.assert_close(load_shape_classifier(path)(data.images), quick(data.images), atol=0, rtol=0)
    assert isinstance(build_image_reward("classifier", {"path": str(path)}), ClassifierReward)
    assert {"analytic", "classifier"} <= set(IMAGE_REWARDS.names())
    with pytest.raises(ConfigError, match="needs 'path'"):
        build_image_reward("classifier")
    with pytest.raises(ConfigError, match="no shape classifier"):
        build_image_reward("classifier", {"path": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="bad arguments"):
        build_image_reward("analytic", {"colours": 1})
    with pytest.raises(ConfigError, match="unknown image reward"):
        build_image_reward("aesthetic")


def test_reward_role_of_two_workers_scores_rows_in_order(resources):
    data = shape_dataset("eval", n=10, seed=0)
    settings = {
        "reward_type": "analytic",
        "reward_kwargs": {"weights": {"brightness": 1.0, "colour": 0.5}},
        "batch_size": 3,
    }
    config = WorkerConfig(name="image_reward", world_size=2)
    cluster = Cluster("image_reward", ImageRewardWorker, resources, config)
    try:
        cluster.initialize(ImageRewardSettings(**settings))
        out = cluster.compute_rewards(DataProto.from_dict({"images": data.images, "class_labels": data.class_labels}))
        with pytest.raises(Exception, match="tensor column 'images'"):
            cluster.compute_rewards(DataProto.from_dict({"class_labels": data.class_labels}))
    finally:
        cluster.shutdown()
    expected, parts = AnalyticImageReward({"brightness": 1.0, "colour": 0.5}).scored(data.images, data.class_labels)
    assert len(out) == 10 and out["scores"].dtype == torch.float32
    torch.testing.assert_close(out["scores"], expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out["reward/colour"], parts["colour"], atol=1e-6, rtol=1e-6)
