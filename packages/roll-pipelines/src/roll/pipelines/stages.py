"""Stages every pipeline shares: data splits, a resumable batch stream, the epoch x mini-batch update, step timers.

A pipeline's ``setup`` and ``step`` read as its algorithm by composing these::

    splits = load_splits(data_args, "sft", tokenizer)                   # train/eval examples + data metrics
    batches = BatchStream(splits.train, batch_size, collator, seed=data_args.seed)   # resumable
    with timer.phase("train"):                                          # time/train_s in the step's metrics
        cluster.train_step(next(batches), UpdatePlan(...))              # worker side: run_update(...)
    if is_eval_step(step, config.eval_steps, max_steps): ...

Worker-side code (``run_update``, ``UpdatePlan``) runs inside Ray actors; the rest runs on the driver.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roll.pipelines.data import DataArgs, FilterReport, StatefulBatchIterator, Task, load_task_rows, prepare_examples
from roll.protocol import DataProto
from roll.runtime import ConfigError

__all__ = [
    "BatchStream",
    "DataSplits",
    "StepTimer",
    "UpdatePlan",
    "batched",
    "is_eval_step",
    "load_split",
    "load_splits",
    "mini_batches",
    "run_update",
]

Example = Mapping[str, Any]
Collator = Callable[[list[Example]], DataProto]


# --- data --------------------------------------------------------------------------------------------------
def load_split(
    data_args: DataArgs, task: Task, tokenizer: Any, split: str = "train"
) -> tuple[list[Example], FilterReport]:
    """One split's examples (loaded, validated, encoded, length-filtered) and the filter report."""
    rows = load_task_rows(data_args, task, split=split)
    return prepare_examples(rows, task, tokenizer, data_args, name=split)


@dataclass(frozen=True)
class DataSplits:
    """Training and evaluation examples (``eval`` empty without ``eval_file_name``) and their data metrics."""

    train: list[Example]
    eval: list[Example]
    metrics: dict[str, float]


def load_splits(data_args: DataArgs, task: Task, tokenizer: Any) -> DataSplits:
    """The train split, and the eval split when ``data_args.eval_file_name`` is set; metrics ``data/{split}/...``."""
    train, report = load_split(data_args, task, tokenizer, "train")
    metrics = report.as_metrics("data/train")
    evaluation: list[Example] = []
    if data_args.eval_file_name:
        evaluation, eval_report = load_split(data_args, task, tokenizer, "eval")
        metrics.update(eval_report.as_metrics("data/eval"))
    return DataSplits(train=train, eval=evaluation, metrics=metrics)


class BatchStream:
    """Endless, resumable batches of ``examples`` collated into DataProtos (see :class:`StatefulBatchIterator`)."""

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        collator: Collator,
        *,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        self.examples = examples
        self.collator = collator
        self.indices = StatefulBatchIterator(len(examples), batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self.indices.epoch

    @property
    def batches_per_epoch(self) -> int:
        return self.indices.batches_per_epoch

    def next_indexed(self) -> tuple[list[int], DataProto]:
        """The next batch with the example indices it was made of."""
        picked = next(self.indices)
        return picked, self.collator([self.examples[i] for i in picked])

    def __iter__(self) -> Iterator[DataProto]:
        return self

    def __next__(self) -> DataProto:
        return self.next_indexed()[1]

    def state_dict(self) -> dict[str, Any]:
        return self.indices.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.indices.load_state_dict(state)


def batched(examples: Sequence[Example], batch_size: int, collator: Collator) -> Iterator[DataProto]:
    """``examples`` in order, ``batch_size`` at a time (the last batch may be smaller): a validation pass."""
    for start in range(0, len(examples), batch_size):
        yield collator(list(examples[start : start + batch_size]))


# --- the update loop (worker side) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class UpdatePlan:
    """How a training worker turns its shard of a batch into optimizer steps.

    ``epochs`` passes over the shard, each split into ``num_mini_batches`` shuffled mini-batches (one optimizer step
    each); ``seed`` fixes the shuffles, which differ per epoch and per data-parallel rank.
    """

    num_mini_batches: int = 1
    epochs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_mini_batches", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"UpdatePlan.{name} must be an integer >= 1, got {value!r}")


def mini_batches(batch: DataProto, count: int, seed: int, epoch: int, rank: int) -> list[DataProto]:
    """``count`` shuffled parts of a rank's shard; every rank makes the same number of optimizer steps. ``rank`` is
    the data-parallel rank (``rank_info.dp_rank``), not the worker rank: the ranks of a sequence-parallel (Ulysses)
    group share one shard and must take its rows in the same order."""
    order = np.random.default_rng([seed, epoch, rank]).permutation(len(batch))
    return [batch.select_idxs(part) for part in np.array_split(order, count)]


def run_update(
    batch: DataProto,
    plan: UpdatePlan,
    rank: int,
    train_step: Callable[[DataProto], Mapping[str, float]],
    *,
    prefix: str,
) -> dict[str, list[float]]:
    """``plan.epochs`` x ``plan.num_mini_batches`` calls of ``train_step``; every metric as a list, one value per
    optimizer step, named ``{prefix}/{name}`` unless the name already has a ``/``."""
    metrics: dict[str, list[float]] = {}
    for epoch in range(plan.epochs):
        for mini in mini_batches(batch, plan.num_mini_batches, plan.seed, epoch, rank):
            for key, value in train_step(mini).items():
                metrics.setdefault(key if "/" in key else f"{prefix}/{key}", []).append(value)
    return metrics


# --- the driver's step ---------------------------------------------------------------------------------------
@dataclass
class StepTimer:
    """Wall time of a step's phases: ``with timer.phase("rollout"): ...`` adds to ``times["time/rollout_s"]``."""

    times: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{name}_s"
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start


def is_eval_step(step: int, eval_steps: int, last_step: int) -> bool:
    """Validate every ``eval_steps`` steps (0: never) and always at the last step."""
    return bool(eval_steps and step % eval_steps == 0) or step == last_step
