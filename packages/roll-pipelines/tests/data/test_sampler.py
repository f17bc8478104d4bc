"""StatefulBatchIterator: deterministic epochs and exact resumption from a state dict."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roll.pipelines.data import DataError, StatefulBatchIterator
from roll.runtime.errors import ConfigError


def take(it: StatefulBatchIterator, n: int) -> list[list[int]]:
    return [next(it) for _ in range(n)]


def test_each_epoch_is_a_permutation_reshuffled_per_epoch() -> None:
    it = StatefulBatchIterator(10, 3, seed=7)
    assert it.batches_per_epoch == 3
    epochs = []
    for epoch in range(3):
        assert it.epoch == epoch
        batches = take(it, 3)
        assert all(len(b) == 3 for b in batches)
        flat = [i for b in batches for i in b]
        assert len(set(flat)) == 9 and set(flat) <= set(range(10))  # one row dropped per epoch
        epochs.append(flat)
    assert epochs[0] != epochs[1] != epochs[2]
    again = StatefulBatchIterator(10, 3, seed=7)
    assert [i for b in take(again, 9) for i in b] == [i for e in epochs for i in e]
    other = StatefulBatchIterator(10, 3, seed=8)
    assert take(other, 3) != [epochs[0][i : i + 3] for i in (0, 3, 6)]


def test_no_shuffle_and_keep_last() -> None:
    it = StatefulBatchIterator(5, 2, seed=0, shuffle=False, drop_last=False)
    assert it.batches_per_epoch == 3
    assert take(it, 4) == [[0, 1], [2, 3], [4], [0, 1]]
    assert it.epoch == 1


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("stop", [0, 1, 2, 3, 4, 7])
def test_resume_mid_epoch_and_across_epochs(stop: int, drop_last: bool) -> None:
    reference = StatefulBatchIterator(11, 4, seed=3, drop_last=drop_last)
    expected = take(reference, 12)
    run = StatefulBatchIterator(11, 4, seed=3, drop_last=drop_last)
    take(run, stop)
    state = json.loads(json.dumps(run.state_dict()))  # checkpoints store plain JSON-compatible data
    resumed = StatefulBatchIterator(11, 4, seed=3, drop_last=drop_last)
    resumed.load_state_dict(state)
    assert resumed.epoch == run.epoch
    assert take(resumed, 12 - stop) == expected[stop:]


@settings(max_examples=40, deadline=None)
@given(
    num_rows=st.integers(1, 30),
    batch_size=st.integers(1, 8),
    stop=st.integers(0, 20),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_resume_property(num_rows: int, batch_size: int, stop: int, drop_last: bool, seed: int) -> None:
    if drop_last and batch_size > num_rows:
        batch_size = num_rows
    it = StatefulBatchIterator(num_rows, batch_size, seed=seed, drop_last=drop_last)
    take(it, stop)
    twin = StatefulBatchIterator(num_rows, batch_size, seed=seed, drop_last=drop_last)
    twin.load_state_dict(copy.deepcopy(it.state_dict()))
    assert take(twin, 5) == take(it, 5)


def test_invalid_settings_and_mismatched_state() -> None:
    with pytest.raises(DataError, match=r"batch_size=8 is larger than the dataset \(5 rows\) and drop_last is set"):
        StatefulBatchIterator(5, 8, seed=0)
    assert take(StatefulBatchIterator(5, 8, seed=0, drop_last=False, shuffle=False), 2) == [[0, 1, 2, 3, 4]] * 2
    with pytest.raises(DataError, match=r"the dataset has no rows"):
        StatefulBatchIterator(0, 1, seed=0)
    with pytest.raises(ConfigError, match=r"batch_size must be at least 1"):
        StatefulBatchIterator(5, 0, seed=0)
    state = StatefulBatchIterator(10, 2, seed=1).state_dict()
    with pytest.raises(DataError, match=r"the checkpoint's batch iterator had num_rows=10 but this one has num_rows=9"):
        StatefulBatchIterator(9, 2, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match=r"had seed=1 but this one has seed=2"):
        StatefulBatchIterator(10, 2, seed=2).load_state_dict(state)
