from __future__ import annotations

import numpy as np
import pytest
import torch

from roll.protocol import (
    DataProto,
    Dispatch,
    Execute,
    ProtocolError,
    RankInfo,
    collect_ranks,
    get_registration,
    register,
    register_dispatch_mode,
    resolve_dispatch_mode,
)


def dp_ranks(n: int) -> list[RankInfo]:
    return [RankInfo(rank=r, world_size=n) for r in range(n)]


def grid_ranks(dp: int, tp: int, pp: int = 1, cp: int = 1) -> list[RankInfo]:
    """Megatron-style order: tp fastest, then cp, then dp, then pp."""
    world = dp * tp * pp * cp
    infos = []
    for rank in range(world):
        tp_rank = rank % tp
        cp_rank = (rank // tp) % cp
        dp_rank = (rank // (tp * cp)) % dp
        pp_rank = rank // (tp * cp * dp)
        infos.append(RankInfo(rank, world, dp_rank, dp, tp_rank, tp, pp_rank, pp, cp_rank, cp))
    return infos


def test_one_to_all_and_one_to_all_one():
    infos = dp_ranks(3)
    calls = Dispatch.ONE_TO_ALL.dispatch((1,), {"k": 2}, infos)
    assert calls == [((1,), {"k": 2})] * 3
    assert Dispatch.ONE_TO_ALL.collect(["a", "b", "c"], infos) == ["a", "b", "c"]
    assert Dispatch.ONE_TO_ALL_ONE.collect(["a", "b", "c"], infos) == "a"


def test_all_to_all_requires_one_item_per_rank():
    infos = dp_ranks(2)
    calls = Dispatch.ALL_TO_ALL.dispatch(([1, 2],), {"x": ["a", "b"]}, infos)
    assert calls == [((1,), {"x": "a"}), ((2,), {"x": "b"})]
    with pytest.raises(ProtocolError, match=r"argument 'x' is a list of length 3"):
        Dispatch.ALL_TO_ALL.dispatch((), {"x": [1, 2, 3]}, infos)
    with pytest.raises(ProtocolError, match="argument 0 is int"):
        Dispatch.ALL_TO_ALL.dispatch((5,), {}, infos)


def test_dp_mp_compute_splits_by_dp_and_replicates_in_the_model_parallel_group():
    infos = grid_ranks(dp=2, tp=2, pp=2)
    data = DataProto.from_dict({"x": torch.arange(5)})
    calls = Dispatch.DP_MP_COMPUTE.dispatch((data, 7), {}, infos)
    for info, (args, _) in zip(infos, calls):
        expected = [0, 1, 2] if info.dp_rank == 0 else [3, 4]
        assert args[0]["x"].tolist() == expected
        assert args[1] == 7
    # Replicas of one DP shard receive the very same object, so the runtime stores it once.
    shard_ids = {info.dp_rank: set() for info in infos}
    for info, (args, _) in zip(infos, calls):
        shard_ids[info.dp_rank].add(id(args[0]))
    assert all(len(ids) == 1 for ids in shard_ids.values())
    outputs = [
        args[0] if info.is_collect_rank else DataProto.from_dict({"x": torch.tensor([-1])})
        for info, (args, _) in zip(infos, calls)
    ]
    assert Dispatch.DP_MP_COMPUTE.collect(outputs, infos)["x"].tolist() == [0, 1, 2, 3, 4]
    assert collect_ranks(Dispatch.DP_MP_COMPUTE, infos) == [4, 6]


def test_dp_mp_compute_splits_lists_tensors_arrays_and_broadcasts_the_rest():
    infos = dp_ranks(2)
    calls = Dispatch.DP_MP_COMPUTE.dispatch(([1, 2, 3], torch.arange(4), np.arange(3)), {"cfg": {"a": 1}}, infos)
    assert calls[0][0][0] == [1, 2] and calls[1][0][0] == [3]
    assert calls[1][0][1].tolist() == [2, 3]
    assert calls[1][0][2].tolist() == [2]
    assert calls[0][1] == {"cfg": {"a": 1}}
    assert Dispatch.DP_MP_COMPUTE.collect([[1, 2], [3]], infos) == [1, 2, 3]
    assert Dispatch.DP_MP_COMPUTE.collect([None, None], infos) is None
    assert Dispatch.DP_MP_COMPUTE.collect([1, 2], infos) == [1, 2]


def test_dp_mp_dispatch_first_sends_data_only_to_the_first_rank_of_each_group():
    infos = grid_ranks(dp=1, tp=2)
    data = DataProto.from_dict({"x": torch.arange(3)}, meta_info={"step": 2})
    calls = Dispatch.DP_MP_DISPATCH_FIRST.dispatch((data,), {}, infos)
    assert len(calls[0][0][0]) == 3
    assert len(calls[1][0][0]) == 0 and calls[1][0][0].meta_info == {"step": 2}


def test_inconsistent_topologies_are_rejected():
    with pytest.raises(ProtocolError, match="multiply"):
        RankInfo(rank=0, world_size=4, dp_rank=0, dp_size=2)
    two_leaders = [RankInfo(0, 2, 0, 1, 0, 2), RankInfo(1, 2, 0, 1, 0, 2)]
    with pytest.raises(ProtocolError, match="both claim"):
        Dispatch.DP_MP_COMPUTE.dispatch((), {}, two_leaders)
    with pytest.raises(ProtocolError, match="no ranks"):
        Dispatch.DP_MP_COMPUTE.dispatch((), {}, [])


def test_custom_modes_register_once_and_unknown_modes_list_the_known_ones():
    def dispatch_reversed(args, kwargs, infos):
        return [((len(infos) - 1 - i,), {}) for i in range(len(infos))]

    def collect_sum(outputs, infos):
        return sum(outputs)

    mode = register_dispatch_mode("TEST_REVERSED_SUM", dispatch_reversed, collect_sum)
    assert Dispatch.get("TEST_REVERSED_SUM") is mode and resolve_dispatch_mode("TEST_REVERSED_SUM") is mode
    assert "TEST_REVERSED_SUM" in Dispatch.names() and not hasattr(Dispatch, "TEST_REVERSED_SUM")
    assert mode.dispatch((), {}, dp_ranks(3)) == [((2,), {}), ((1,), {}), ((0,), {})]
    assert mode.collect([1, 2, 3], dp_ranks(3)) == 6
    with pytest.raises(ProtocolError, match="already registered"):
        register_dispatch_mode("TEST_REVERSED_SUM", dispatch_reversed, collect_sum)
    with pytest.raises(ProtocolError, match=r"unknown dispatch mode 'NOPE'; known modes: \[.*'DP_MP_COMPUTE'"):
        resolve_dispatch_mode("NOPE")
    with pytest.raises(ProtocolError, match="unknown dispatch mode 'NOPE'"):
        Dispatch.get("NOPE")
    with pytest.raises(ProtocolError, match="already registered"):
        register_dispatch_mode("ONE_TO_ALL", dispatch_reversed, collect_sum)


def test_builtin_modes_are_plain_typed_constants():
    builtins = ["ALL_TO_ALL", "DP_MP_COMPUTE", "DP_MP_DISPATCH_FIRST", "ONE_TO_ALL", "ONE_TO_ALL_ONE"]
    for name in builtins:
        mode = vars(Dispatch)[name]  # a class attribute, not produced by a metaclass hook
        assert mode is Dispatch.get(name) and mode.name == name and repr(mode) == f"Dispatch.{name}"
    assert type(Dispatch) is type
    with pytest.raises(TypeError, match="namespace"):
        Dispatch()


def test_register_records_the_contract_for_sync_and_async_methods():
    class Worker:
        @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False, prefetch=True)
        def train_step(self, data):
            return data

        @register(dispatch_mode="ONE_TO_ALL", execute_mode=Execute.RANK_ZERO)
        async def generate(self, data):
            return data

        @register
        def ping(self):
            return "pong"

        def plain(self):
            return None

    train = get_registration(Worker.train_step)
    assert (
        train.dispatch_mode is Dispatch.DP_MP_COMPUTE
        and not train.clear_cache
        and train.prefetch
        and not train.is_async
    )
    generate = get_registration(Worker.generate)
    assert generate.is_async and generate.execute_mode is Execute.RANK_ZERO
    assert get_registration(Worker.ping).dispatch_mode is Dispatch.ONE_TO_ALL
    assert get_registration(Worker.plain) is None
    assert Worker().ping() == "pong"
    with pytest.raises(ProtocolError, match="unknown dispatch mode"):
        register(dispatch_mode="BOGUS")
