"""The shared stages (roll.pipelines.stages) and the explicit construction of pipelines, without Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from roll.pipelines import BasePipeline, load_config
from roll.pipelines.data import DataArgs, SFTCollator
from roll.pipelines.sft import SFTPipeline
from roll.pipelines.stages import (
    BatchStream,
    StepTimer,
    UpdatePlan,
    batched,
    is_eval_step,
    load_split,
    load_splits,
    run_update,
)
from roll.protocol import DataProto
from roll.runtime import ConfigError


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from roll.strategies.testing import make_tiny_causal_lm

    return AutoTokenizer.from_pretrained(make_tiny_causal_lm(tmp_path_factory.mktemp("tiny"), preset="nano"))


def _rows(tmp_path: Path, name: str, count: int, long_every: int = 0) -> str:
    rows = [
        {"prompt": " ".join(["word"] * (200 if long_every and i % long_every == 0 else 3)), "response": f"a{i}"}
        for i in range(count)
    ]
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_load_splits_reads_train_and_eval_with_their_metrics(tmp_path: Path, tokenizer: Any) -> None:
    args = DataArgs(
        file_name=_rows(tmp_path, "train.jsonl", 6, long_every=3),
        eval_file_name=_rows(tmp_path, "eval.jsonl", 2),
        apply_chat_template=False,
        max_length=64,
    )
    splits = load_splits(args, "sft", tokenizer)
    assert len(splits.train) == 4 and len(splits.eval) == 2  # rows 0 and 3 are too long
    assert splits.metrics["data/train/total"] == 6 and splits.metrics["data/train/kept"] == 4
    assert splits.metrics["data/eval/kept"] == 2
    examples, report = load_split(args, "sft", tokenizer, "eval")
    assert len(examples) == report.kept == 2
    no_eval = load_splits(args.model_copy(update={"eval_file_name": None}), "sft", tokenizer)
    assert no_eval.eval == [] and "data/eval/kept" not in no_eval.metrics


def test_batch_stream_collates_and_resumes_exactly(tmp_path: Path, tokenizer: Any) -> None:
    args = DataArgs(file_name=_rows(tmp_path, "train.jsonl", 10), apply_chat_template=False, max_length=64)
    examples = load_splits(args, "sft", tokenizer).train
    collator = SFTCollator(0, 64)
    stream = BatchStream(examples, 3, collator, seed=5)
    assert stream.batches_per_epoch == 3
    first = next(stream)
    assert isinstance(first, DataProto) and len(first) == 3
    state = stream.state_dict()
    expected = [stream.next_indexed()[0] for _ in range(4)]
    assert stream.epoch == 1  # a batch never spans two epochs; the 10th row is dropped (drop_last)
    again = BatchStream(examples, 3, collator, seed=5)
    again.load_state_dict(state)
    assert [again.next_indexed()[0] for _ in range(4)] == expected
    indices, batch = BatchStream(examples, 4, collator, seed=0, shuffle=False).next_indexed()
    assert indices == [0, 1, 2, 3] and torch.equal(batch.batch["input_ids"], collator(examples[:4]).batch["input_ids"])
    assert [len(b) for b in batched(examples, 4, collator)] == [4, 4, 2]


def test_run_update_makes_epochs_times_mini_batches_steps_over_the_whole_shard() -> None:
    batch = DataProto.from_dict({"x": torch.arange(10)})
    seen: list[list[int]] = []

    def step(mini: DataProto) -> dict[str, float]:
        seen.append(mini.batch["x"].tolist())
        return {"loss": float(len(mini)), "critic/extra": 1.0}

    metrics = run_update(
        batch, UpdatePlan(num_mini_batches=3, epochs=2, seed=7), rank=0, train_step=step, prefix="actor"
    )
    assert len(seen) == 6 and metrics["actor/loss"] == [4.0, 3.0, 3.0] * 2 and metrics["critic/extra"] == [1.0] * 6
    for epoch in (seen[:3], seen[3:]):
        assert sorted(x for part in epoch for x in part) == list(range(10))  # each epoch covers the shard once
    assert seen[:3] != seen[3:]  # reshuffled per epoch
    other: list[list[int]] = []
    run_update(batch, UpdatePlan(num_mini_batches=3, epochs=2, seed=7), 1, lambda m: other.append(1) or {}, prefix="a")
    assert len(other) == 6
    for bad in ({"num_mini_batches": 0}, {"epochs": 0}, {"epochs": 1.5}):
        with pytest.raises(ConfigError, match="UpdatePlan"):
            UpdatePlan(**bad)


def test_step_timer_and_eval_steps() -> None:
    timer = StepTimer()
    with timer.phase("rollout"):
        pass
    with pytest.raises(RuntimeError), timer.phase("train"):
        raise RuntimeError("the phase's time is recorded even when it fails")
    with timer.phase("rollout"):
        pass
    assert set(timer.times) == {"time/rollout_s", "time/train_s"} and all(t >= 0 for t in timer.times.values())
    assert [s for s in range(1, 11) if is_eval_step(s, 4, 10)] == [4, 8, 10]
    assert [s for s in range(1, 11) if is_eval_step(s, 0, 10)] == [10]


def test_constructing_a_pipeline_starts_nothing_and_setup_is_explicit(tmp_path: Path) -> None:
    config: Any = load_config(
        {
            "pipeline_cls": "sft",
            "output_dir": str(tmp_path / "out"),
            "sft_train": {
                "model_args": {"model_name_or_path": str(tmp_path / "model")},
                "data_args": {"file_name": "x.jsonl", "max_length": 16},
                "strategy_args": {"strategy_name": "hf_infer"},
            },
        }
    )
    was_running = ray.is_initialized()
    pipeline = SFTPipeline(config)
    assert isinstance(pipeline, BasePipeline) and pipeline.config is config and pipeline.clusters == {}
    assert not (tmp_path / "out").exists() and ray.is_initialized() == was_running
    with pytest.raises(RuntimeError, match="must call open_session"):
        pipeline.session  # noqa: B018
    pipeline.shutdown()  # before setup: nothing to stop, and no error
    pipeline.shutdown()
