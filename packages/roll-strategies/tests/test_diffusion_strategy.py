"""The strategies' diffusion hook (``model_args.model_kind: diffusion``): fsdp2_train and hf_infer load a diffusers
folder, run model functions (``forward_model``) and train with them (``train_model_step``), and export a diffusers
folder with the scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import (
    LossScale,
    StrategyError,
)
from roll.strategies.diffusion import (
    load_diffusion_model,
    load_scheduler,
    make_tiny_diffusion_model,
    predict,
)
from roll.strategies.testing.train import tiny_strategy

pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def unet(tmp_path_factory) -> Path:
    return make_tiny_diffusion_model(tmp_path_factory.mktemp("unet") / "model", preset="unet-nano", seed=3)


def _strategy(path: Path, strategy: str, **training: float | int):
    return tiny_strategy(
        path,
        f"diffusion-{strategy}",
        strategy=strategy,
        model_args={"model_kind": "diffusion"},
        training_args={"learning_rate": 1e-3, **training},
        infer_batch_size=3,
    )


def _batch(n: int = 6, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        {
            "x": torch.randn((n, 3, 16, 16), generator=g),
            "t": torch.rand((n,), generator=g) * 1000,
            "labels": torch.randint(0, 24, (n,), generator=g),
            "target": torch.randn((n, 3, 16, 16), generator=g),
        }
    )


def _predict(micro: DataProto, call) -> dict[str, torch.Tensor]:
    return {"out": call(micro.batch["x"], micro.batch["t"], micro.batch["labels"])}


def _loss(micro: DataProto, call, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    out = call(micro.batch["x"], micro.batch["t"], micro.batch["labels"])
    per_row = (out - micro.batch["target"]).pow(2).flatten(1).mean(1)
    return per_row.sum() / scale.num_seqs, {"rows": float(len(micro))}


@pytest.mark.parametrize("name", ["fsdp2_train", "hf_infer"])
def test_forward_model_matches_the_plain_model(unet, name):
    strategy = _strategy(unet, name)
    assert strategy.tokenizer is None
    batch = _batch(7)  # 3 micro-batches of infer_batch_size=3
    got = strategy.forward_model(batch, _predict)["out"]
    plain = load_diffusion_model(unet, train=False)
    with torch.no_grad():
        want = predict(plain, batch.batch["x"], batch.batch["t"], batch.batch["labels"])
    torch.testing.assert_close(got, want, **TOL)


def test_train_model_step_learns_and_does_not_depend_on_micro_batch_size(unet, tmp_path):
    batch = _batch(4, seed=1)
    small = _strategy(unet, "fsdp2_train", per_device_train_batch_size=1)
    whole = _strategy(unet, "fsdp2_train", per_device_train_batch_size=4)
    first = [s.train_model_step(batch, _loss) for s in (small, whole)]
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], rel=1e-5)
    assert first[0]["grad_norm"] == pytest.approx(first[1]["grad_norm"], rel=1e-4)
    losses = [whole.train_model_step(batch, _loss)["loss"] for _ in range(3)]
    assert losses[-1] < first[1]["loss"], (first[1]["loss"], losses)
    # export: a diffusers folder with the scheduler, reloading to the trained weights
    whole.export_hf(str(tmp_path / "export"))
    exported = load_diffusion_model(tmp_path / "export", train=False)
    for name, tensor in whole.named_weights():
        torch.testing.assert_close(exported.state_dict()[name], tensor, **TOL, msg=name)
    assert type(load_scheduler(tmp_path / "export")).__name__ == type(load_scheduler(unet)).__name__


def test_a_diffusion_role_needs_a_diffusers_folder_and_rows(unet, tmp_path):
    strategy = _strategy(unet, "fsdp2_train")
    with pytest.raises(StrategyError, match="no rows"):
        strategy.train_model_step(_batch(2)[:0], _loss)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a diffusers model folder"):
        _strategy(tmp_path / "empty", "fsdp2_train")
