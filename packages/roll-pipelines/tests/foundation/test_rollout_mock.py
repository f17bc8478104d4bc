"""rollout_mock (ROLL's dump / mock): a dumped step replays as the identical batch, writes are all-or-nothing, and a
missing or foreign dump is an error naming the step and the file."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from roll.pipelines.rollout_mock import RolloutMock, RolloutMockConfig, RolloutMockError
from roll.protocol import DataProto


def _batch(seed: int) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    batch = DataProto.from_dict(
        {"responses": torch.randint(0, 100, (4, 6), generator=g), "scores": torch.rand(4, generator=g)}
    )
    batch.non_tensor_batch["tag"] = np.array(["a", "b", "a", "b"], dtype=object)
    batch.non_tensor_batch["reward_info"] = np.array([{"x": i} for i in range(4)], dtype=object)
    return batch


def _mock(tmp_path: Path, mode: str, pipeline: str = "rlvr") -> RolloutMock:
    return RolloutMock(RolloutMockConfig(enable=True, mode=mode, dump_dir=str(tmp_path)), pipeline)  # type: ignore[arg-type]


def test_dump_then_replay_gives_identical_batches(tmp_path: Path) -> None:
    dump = _mock(tmp_path, "dump")
    assert dump.dumping and not dump.replaying
    for step in (1, 2):
        path = dump.dump(step, _batch(step), {"rollout/score": 0.5 * step})
        assert path == tmp_path / "train" / f"step_{step:06d}.pkl"  # ROLL's layout
    replay = _mock(tmp_path, "replay")  # ROLL calls it mock; replay is accepted
    assert replay.config.mode == "mock" and replay.replaying
    for step in (1, 2):
        out = replay.load(step)
        want = _batch(step)
        assert out.metrics == {"rollout/score": 0.5 * step}
        assert set(out.batch.batch.keys()) == set(want.batch.keys())
        for key in want.batch.keys():
            assert torch.equal(out.batch.batch[key], want.batch[key])
        assert out.batch.non_tensor_batch["tag"].tolist() == want.non_tensor_batch["tag"].tolist()
        assert out.batch.non_tensor_batch["reward_info"].tolist() == want.non_tensor_batch["reward_info"].tolist()
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["step_000001.pkl", "step_000002.pkl"]


def test_a_crash_while_writing_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = _mock(tmp_path, "dump")
    dump.dump(1, _batch(1))
    before = dump.path(1).read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process is stopped mid-write

    monkeypatch.setattr(pickle, "dump", crash)
    with pytest.raises(KeyboardInterrupt):
        dump.dump(1, _batch(9))
    with pytest.raises(KeyboardInterrupt):
        dump.dump(2, _batch(2))
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["step_000001.pkl"]  # no temporary left
    assert dump.path(1).read_bytes() == before  # the earlier dump is untouched


def test_missing_and_mismatched_dumps_name_the_step_and_file(tmp_path: Path) -> None:
    _mock(tmp_path, "dump").dump(1, _batch(1))
    replay = _mock(tmp_path, "mock")
    with pytest.raises(RolloutMockError, match=r"step 2 has no dump at .*step_000002\.pkl.*step_000001\.pkl"):
        replay.load(2)
    with pytest.raises(RolloutMockError, match=r"step 1: .*step_000001\.pkl was dumped by \{'pipeline': 'rlvr'\}"):
        _mock(tmp_path, "mock", pipeline="agentic").load(1)
    with pytest.raises(RolloutMockError, match="holds 4 rows but this run's batch has 8"):
        replay.load(1, rows=8)
    (tmp_path / "train" / "step_000003.pkl").write_bytes(pickle.dumps(_batch(3)))  # a bare pickle (ROLL's layout)
    with pytest.raises(RolloutMockError, match="step 3: .* is not a roll rollout dump"):
        replay.load(3)
    (tmp_path / "train" / "step_000004.pkl").write_bytes(b"\x80\x05trunc")
    with pytest.raises(RolloutMockError, match="step 4: .* is not readable"):
        replay.load(4)
