"""Scaffolding for tests that train tiny models through a strategy: a role's config, an in-process strategy, an SFT
batch and loss, and a Ray role of such workers.

The functions here are importable by Ray workers (unlike functions defined in a test file), so worker classes and
loss functions can refer to them without being shipped by value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from roll.protocol import DataProto, Dispatch, register
from roll.runtime import Cluster, ResourceManager
from roll.strategies.config import ModelArgs, StrategyArgs, StrategyWorkerConfig, TrainingArgs
from roll.strategies.contract import SHARE, LossScale
from roll.strategies.ops import language_model_loss
from roll.strategies.worker import StrategyWorker

__all__ = [
    "SftWorker",
    "logits_of",
    "running_cluster",
    "sft_batch",
    "sft_loss",
    "tiny_strategy",
    "tiny_worker_config",
]

W = TypeVar("W", bound=StrategyWorker)


def tiny_worker_config(
    model: Path | str, name: str = "actor", *, strategy: str = "fsdp2_train", **overrides: Any
) -> StrategyWorkerConfig:
    """A role running ``strategy`` on ``model`` in float32 with learning rate 1e-4 and 2 rows per micro-batch.

    ``model_args``, ``training_args`` (dicts) and ``strategy_config`` update those sections; any other keyword is a
    field of :class:`StrategyWorkerConfig` (``world_size``, ``infer_batch_size``, ``batching``...).
    """
    model_args = {"model_name_or_path": str(model), "dtype": "float32", **overrides.pop("model_args", {})}
    # A small LR keeps Adam's near-sign updates of tiny gradients from amplifying float rounding differences
    # between equivalent runs (micro-batch sizes, rank counts) beyond the 1e-5 the tests allow.
    training = {"learning_rate": 1e-4, "per_device_train_batch_size": 2, **overrides.pop("training_args", {})}
    return StrategyWorkerConfig(
        name=name,
        model_args=ModelArgs(**model_args),
        training_args=TrainingArgs(**training),
        strategy_args=StrategyArgs(strategy_name=strategy, strategy_config=overrides.pop("strategy_config", {})),
        **overrides,
    )


def tiny_strategy(model: Path | str, name: str = "actor", **overrides: Any) -> Any:
    """The initialized strategy of an in-process worker of :func:`tiny_worker_config`'s role."""
    worker = StrategyWorker(tiny_worker_config(model, name, **overrides))
    worker.initialize()
    return worker.strategy


def sft_batch(rows: int = 4, seed: int = 1, length: int = 12, *, padded: bool = True, high: int = 500) -> DataProto:
    """Rows of random tokens in ``[4, high)``, right-padded by ``row % 4`` columns when ``padded``; ``labels`` are the
    ids (-100 at padding) and ``loss_mask`` marks the label positions that count (never the first token)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, high, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        for row in range(rows):
            mask[row, length - row % 4 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    loss_mask = (labels != -100).long()
    loss_mask[:, 0] = 0  # the first token is never predicted
    data = {"input_ids": ids, "attention_mask": mask, "labels": labels, "loss_mask": loss_mask}
    return DataProto.from_dict(data)


def sft_loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean cross-entropy over the whole mini-batch (the global token count comes in the LossScale); metrics:
    this micro-batch's ``tokens`` and ``nll``, its share of the mini-batch's cross-entropy (summed by strategies)."""
    labels = micro.batch["labels"].to(logits.device)
    loss, tokens = language_model_loss(logits, labels, num_tokens=scale.num_tokens)
    return loss, {"tokens": float(tokens), f"nll{SHARE}": float(loss.detach())}


def logits_of(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """forward_func: the logits themselves (on the CPU)."""
    return {"logits": logits.detach().cpu().clone()}


class SftWorker(StrategyWorker):
    """A training role with an SFT step on :func:`sft_batch`'s columns and a forward that returns logits."""

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def train(self, data: DataProto) -> dict[str, float]:
        return self.train_strategy.train_step(data, sft_loss, loss_mask_key="loss_mask")

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def logits(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(self.strategy.forward_step(data, logits_of))


@contextlib.contextmanager
def running_cluster(
    name: str, worker_cls: type[W], resources: ResourceManager, config: StrategyWorkerConfig
) -> Iterator[Cluster]:
    """A started cluster of ``worker_cls`` for ``config``'s role, shut down on exit (also when starting fails)."""
    cluster = Cluster(name, worker_cls, resources, config)
    try:
        cluster.initialize()
        yield cluster
    finally:
        cluster.shutdown()
