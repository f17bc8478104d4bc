"""Diffusion models as a backend: tiny builders, save/load round trips, the missing-extra error, and FSDP2 sharding
on two ranks (two Ray workers over gloo) matching one unsharded process."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
import torch

from roll.runtime import Cluster, DataProto, Dispatch, MissingExtraError, Worker, WorkerConfig, register
from roll.runtime.errors import ConfigError
from roll.runtime.testing import ship_module_by_value

pytest.importorskip("diffusers")

from roll.strategies.diffusion import (
    build_diffusion_model,
    diffusion_blocks,
    full_state_dict,
    load_diffusion_model,
    load_scheduler,
    make_tiny_diffusion_model,
    predict,
    save_diffusion_model,
    shard_diffusion_model,
)

ship_module_by_value(__name__)
pytestmark = pytest.mark.extra("diffusers")  # diffusers is outside the Pants resolve

TOL = {"atol": 1e-6, "rtol": 1e-5}


def _inputs(batch: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 16, 16, generator=gen)
    t = torch.rand(batch, generator=gen) * 1000
    labels = torch.randint(0, 24, (batch,), generator=gen)
    return x, t, labels


@pytest.mark.parametrize("preset", ["unet-nano", "dit-nano"])
def test_tiny_model_round_trips_through_save_pretrained(preset, tmp_path):
    path = make_tiny_diffusion_model(tmp_path / preset, preset=preset, seed=3)
    stamp = json.loads((path / "roll_tiny.json").read_text())
    assert stamp["preset"] == preset and stamp["num_parameters"] > 10_000
    mtime = (path / "config.json").stat().st_mtime_ns
    assert make_tiny_diffusion_model(path, preset=preset, seed=3) == path  # idempotent: not rebuilt
    assert (path / "config.json").stat().st_mtime_ns == mtime
    model = load_diffusion_model(path)
    fresh = build_diffusion_model(preset, seed=3)
    x, t, labels = _inputs()
    with torch.no_grad():
        out = predict(model, x, t, labels)
        assert out.shape == x.shape
        torch.testing.assert_close(out, predict(fresh, x, t, labels), atol=0, rtol=0)
        # the class condition changes the prediction
        assert not torch.allclose(out, predict(model, x, t, (labels + 1) % 24))
    assert type(load_scheduler(path)).__name__ == "FlowMatchEulerDiscreteScheduler"
    frozen = load_diffusion_model(path, train=False)
    assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training


def test_different_seeds_give_different_weights_and_vp_schedulers_save(tmp_path):
    a, b = build_diffusion_model("unet-nano", seed=0), build_diffusion_model("unet-nano", seed=1)
    assert not torch.equal(a.conv_in.weight, b.conv_in.weight)
    path = make_tiny_diffusion_model(tmp_path / "vp", scheduler="ddim", prediction_type="v_prediction")
    scheduler = load_scheduler(path)
    assert type(scheduler).__name__ == "DDIMScheduler" and scheduler.config.prediction_type == "v_prediction"


def test_bad_folders_presets_and_classes_raise_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown diffusion preset"):
        build_diffusion_model("unet-huge")
    with pytest.raises(ConfigError, match="_class_name"):
        build_diffusion_model({"block_out_channels": [8]})
    with pytest.raises(ConfigError, match="does not exist"):
        load_diffusion_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "os.system"}))
    with pytest.raises(ConfigError, match="not a supported diffusion model"):
        load_diffusion_model(tmp_path)
    with pytest.raises(ConfigError, match="not a supported diffusion model"):
        predict(torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1))


def test_missing_diffusers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # makes `import diffusers` raise ImportError
    with pytest.raises(MissingExtraError) as info:
        build_diffusion_model("unet-nano")
    assert info.value.pip_command == "pip install 'roll-strategies[diffusion]'"


def test_blocks_are_the_repeated_units():
    unet = build_diffusion_model("unet-nano")
    assert [type(b).__name__ for b in diffusion_blocks(unet)] == [
        "DownBlock2D",
        "DownBlock2D",
        "DownBlock2D",
        "UNetMidBlock2D",
        "UpBlock2D",
        "UpBlock2D",
        "UpBlock2D",
    ]
    assert len(diffusion_blocks(build_diffusion_model("dit-nano"))) == 4
    with pytest.raises(ConfigError, match="no block"):
        diffusion_blocks(unet, ["NoSuchBlock"])


# --- two ranks on Ray --------------------------------------------------------------------------------------------
def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = predict(model, batch["x"], batch["t"], batch["labels"])
    return (out - batch["target"]).pow(2).mean()


class ShardedDiffusionWorker(Worker):
    """Builds a seeded model, shards it over the role's ranks (gloo) and runs one training step."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def setup(self, preset: str) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="env://", rank=self.rank, world_size=self.world_size)
        mesh = init_device_mesh("cpu", (self.world_size,))
        self.model = shard_diffusion_model(build_diffusion_model(preset, seed=5), mesh)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def step(self, data: DataProto) -> dict:
        batch = {k: data.batch[k] for k in ("x", "t", "labels", "target")}
        loss = _loss(self.model, batch)
        loss.backward()
        grads = {n: p.grad.full_tensor().clone() for n, p in self.model.named_parameters()}
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": loss.item(), "grads": grads}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export(self, path: str) -> dict[str, torch.Tensor]:
        state = full_state_dict(self.model)
        if self.rank == 0:
            save_diffusion_model(self.model, path, state_dict=state)
        return state


@pytest.mark.parametrize("preset", ["unet-nano", "dit-nano"])
def test_fsdp2_two_ranks_match_one_unsharded_process(preset, resources, tmp_path):
    x, t, labels = _inputs(batch=6, seed=1)
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    batch = {"x": x, "t": t, "labels": labels, "target": target}

    reference = build_diffusion_model(preset, seed=5)
    # SGD: its step is linear in the gradient (Adam's first step is sign(grad), which flips on ~1e-9 noise)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_loss = _loss(reference, batch)
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in reference.named_parameters()}
    optimizer.step()

    config = WorkerConfig(name="diffusion", world_size=2, system_envs={"OMP_NUM_THREADS": "1"})
    cluster = Cluster(f"diffusion-{uuid.uuid4().hex[:8]}", ShardedDiffusionWorker, resources, config)
    try:
        cluster.setup(preset)
        per_rank = cluster.step(DataProto.from_dict(batch))
        assert len(per_rank) == 2
        # each rank's loss is the mean over its 3 rows; the 6-row mean is their average
        assert (per_rank[0]["loss"] + per_rank[1]["loss"]) / 2 == pytest.approx(ref_loss.item(), abs=1e-6)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(per_rank[0]["grads"][name], grad, **TOL, msg=name)
        exported = cluster.export(str(tmp_path / "export"))
    finally:
        cluster.shutdown()
    for name, param in reference.state_dict().items():
        torch.testing.assert_close(exported[0][name], param, **TOL, msg=name)
    reloaded = load_diffusion_model(tmp_path / "export")
    with torch.no_grad():
        torch.testing.assert_close(predict(reloaded, x, t, labels), predict(reference, x, t, labels), **TOL)
