"""Weight sync on GPUs: CUDA IPC slots for engines on the trainer's GPU, NCCL broadcast to engines on other GPUs.

Marked ``gpu``: skipped where CUDA is missing (the repository conftest). The NCCL test needs two GPUs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from roll.protocol import Dispatch, register
from roll.runtime import Cluster, ResourceManager
from roll.runtime.testing import ship_module_by_value
from roll.strategies import ModelArgs, ModelUpdateGroup, StrategyArgs, StrategyWorker, StrategyWorkerConfig

ship_module_by_value(__name__)

pytestmark = pytest.mark.gpu


class TrainWorker(StrategyWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nudge(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.strategy.model.parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                local.add_((torch.randn(local.shape, generator=generator) * 0.01).to(local.device))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor.cpu().clone() for name, tensor in self.train_strategy.named_weights()}


class InferWorker(StrategyWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().cpu().clone() for name, p in self.strategy.model.state_dict().items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def offload_and_reload(self) -> None:
        self.strategy.offload_states()  # the model to host memory and back: buffers are new objects after it
        self.strategy.load_states()


def start(model: Path, resources: ResourceManager, worker_cls, strategy: str, devices: list[int]) -> Cluster:
    config = StrategyWorkerConfig(
        name=f"gpu-{strategy}-{uuid.uuid4().hex[:6]}",
        device_mapping=devices,
        model_args=ModelArgs(model_name_or_path=str(model), dtype="float32"),
        strategy_args=StrategyArgs(strategy_name=strategy),
    )
    cluster = Cluster(config.name, worker_cls, resources, config)
    cluster.initialize()
    return cluster


@pytest.fixture(scope="module")
def gpus(ray_session) -> ResourceManager:
    return ResourceManager()


@pytest.fixture(scope="module")
def trainer(tiny_model, gpus) -> Iterator[Cluster]:
    cluster = start(tiny_model, gpus, TrainWorker, "fsdp2_train", [0])
    yield cluster
    cluster.shutdown()


def sync_and_compare(
    trainer: Cluster, receivers: Cluster, transport: str = "auto", between: Callable[[], None] | None = None
) -> ModelUpdateGroup:
    """Two nudge-sync-compare rounds (``between`` runs after the first); every engine tensor equals the trainer's."""
    group = ModelUpdateGroup(trainer, receivers, bucket_size_mb=0.2, transport=transport)
    try:
        for seed in (1, 2):
            if seed == 2 and between is not None:
                between()
            trainer.nudge(seed)
            metrics = group.update(seed, force=True)
            expected = trainer.weights()[0]
            for got in receivers.weights():
                assert all(torch.equal(tensor, expected[name]) for name, tensor in got.items())
        assert metrics["weight_sync/bytes"] > 0 and metrics["weight_sync/buckets"] >= 5
    finally:
        group.close()
    return group


def test_an_engine_on_the_trainers_gpu_reads_its_slots_through_cuda_ipc(tiny_model, gpus, trainer):
    receivers = start(tiny_model, gpus, InferWorker, "hf_infer", [0])
    try:
        # The engine offloads and reloads between the syncs: the second must reach the reloaded tensors.
        group = sync_and_compare(trainer, receivers, between=receivers.offload_and_reload)
    finally:
        receivers.shutdown()
    assert group.routes.storage == "cuda" and group.routes.readers == (0,) and group.routes.broadcast == ()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_an_engine_on_another_gpu_gets_nccl_broadcasts(tiny_model, gpus, trainer):
    receivers = start(tiny_model, gpus, InferWorker, "hf_infer", [1])
    try:
        group = sync_and_compare(trainer, receivers)
    finally:
        receivers.shutdown()
    assert group.routes.readers == () and group.routes.broadcast == (0,)


def test_vllm_on_the_trainers_gpu_decodes_like_transformers_after_a_sync(tiny_model, gpus, trainer, tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from roll.strategies import GenerationConfig

    class Rollout(StrategyWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
            from roll.protocol import DataProto

            width = max(len(p) for p in prompts)
            ids = torch.tensor([[3] * (width - len(p)) + p for p in prompts])
            mask = (torch.arange(width)[None, :] >= (width - torch.tensor([len(p) for p in prompts]))[:, None]).long()
            batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask})
            config = GenerationConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)
            return self.strategy.generate(batch, config)["responses"].tolist()

    config = StrategyWorkerConfig(
        name=f"gpu-vllm-{uuid.uuid4().hex[:6]}",
        device_mapping=[0],
        model_args=ModelArgs(model_name_or_path=str(tiny_model), dtype="float32"),
        strategy_args=StrategyArgs(
            strategy_name="vllm", strategy_config={"max_model_len": 128, "gpu_memory_utilization": 0.2}
        ),
    )
    rollout = Cluster(config.name, Rollout, gpus, config)
    try:
        rollout.initialize()
        trainer.nudge(7)
        group = ModelUpdateGroup(trainer, rollout, bucket_size_mb=0.2)
        try:
            group.update(0, force=True)
            assert group.routes.storage == "cuda" and group.routes.readers == (0,)
        finally:
            group.close()
        trainer.export_hf(str(tmp_path / "trained"))
        reference = AutoModelForCausalLM.from_pretrained(tmp_path / "trained", dtype=torch.float32).eval()
        prompts = [[5, 6, 7, 8], [100, 200, 300]]
        expected = []
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(6):
                with torch.no_grad():
                    ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
            expected.append(ids[len(prompt) :])
        assert rollout.greedy(prompts)[0] == expected
    finally:
        rollout.shutdown()
