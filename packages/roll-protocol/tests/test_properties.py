"""Property tests: chunk/concat identity, pickle round trips, DP_MP_COMPUTE delivery over topology grids."""

from __future__ import annotations

import pickle

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roll.protocol import DataProto, Dispatch, RankInfo
from roll.protocol.testing import assert_dataproto_equal

text = st.one_of(st.none(), st.text(max_size=12))
nested = st.one_of(
    st.none(), st.lists(st.integers(-5, 5), max_size=4), st.lists(st.lists(st.text(max_size=3), max_size=2), max_size=2)
)
records = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "turn": st.integers(0, 9)})


@st.composite
def dataprotos(draw, min_rows: int = 0, max_rows: int = 24) -> DataProto:
    n = draw(st.integers(min_rows, max_rows))
    width = draw(st.integers(0, 3))
    tensors = {
        "ids": torch.arange(n * width, dtype=torch.int64).reshape(n, width),
        "score": torch.tensor(
            draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=n, max_size=n)), dtype=torch.float32
        ),
    }
    columns = {
        "text": draw(st.lists(text, min_size=n, max_size=n)),
        "nested": draw(st.lists(nested, min_size=n, max_size=n)),
        "record": draw(st.lists(records, min_size=n, max_size=n)),
    }
    return DataProto.from_dict(tensors, columns, {"metrics": {"m": 1.0}})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=dataprotos(min_rows=1), n=st.integers(1, 24))
def test_chunk_then_concat_is_the_identity(data, n):
    n = min(n, len(data))
    parts = data.chunk(n)
    assert len(parts) == n and sum(len(p) for p in parts) == len(data)
    assert_dataproto_equal(DataProto.concat(parts), data)


@settings(max_examples=60, deadline=None)
@given(data=dataprotos())
def test_pickle_round_trip_in_band_and_out_of_band(data):
    assert_dataproto_equal(pickle.loads(pickle.dumps(data)), data)
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    assert_dataproto_equal(pickle.loads(stream, buffers=buffers), data)


def _megatron_grid(dp: int, tp: int, pp: int, cp: int) -> list[RankInfo]:
    world = dp * tp * pp * cp
    return [
        RankInfo(
            rank=r,
            world_size=world,
            tp_rank=r % tp,
            tp_size=tp,
            cp_rank=(r // tp) % cp,
            cp_size=cp,
            dp_rank=(r // (tp * cp)) % dp,
            dp_size=dp,
            pp_rank=r // (tp * cp * dp),
            pp_size=pp,
        )
        for r in range(world)
    ]


@st.composite
def topologies(draw) -> tuple[int, int, int, int]:
    sizes = []
    budget = 16
    for _ in range(4):
        size = draw(st.sampled_from([s for s in (1, 2, 3, 4) if s <= budget]))
        sizes.append(size)
        budget //= size
    return tuple(sizes)


@settings(max_examples=80, deadline=None)
@given(grid=topologies(), rows=st.integers(0, 40), seed=st.integers(0, 10**6))
def test_dp_mp_compute_delivers_every_row_exactly_once_in_order(grid, rows, seed):
    dp, tp, pp, cp = grid
    infos = _megatron_grid(dp, tp, pp, cp)
    generator = torch.Generator().manual_seed(seed)
    infos = [infos[i] for i in torch.randperm(len(infos), generator=generator).tolist()]  # actor order is arbitrary
    data = DataProto.from_dict({"row": torch.arange(rows)}, {"tag": [str(i) for i in range(rows)]})
    calls = Dispatch.DP_MP_COMPUTE.dispatch((data,), {}, infos)
    # Every rank of one DP group sees the same shard; non-collected ranks return garbage that must be ignored.
    outputs = []
    for info, (args, _) in zip(infos, calls):
        shard = args[0]
        outputs.append(
            shard
            if info.is_collect_rank
            else DataProto.from_dict({"row": -shard["row"] - 1}, {"tag": ["x"] * len(shard)})
        )
    result = Dispatch.DP_MP_COMPUTE.collect(outputs, infos)
    assert result["row"].tolist() == list(range(rows))
    assert result["tag"].tolist() == [str(i) for i in range(rows)]
