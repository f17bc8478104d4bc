from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

from roll.protocol import DataProto, NonTensorBatch, ProtocolError, pad_dataproto_to_divisor, unpad_dataproto
from roll.protocol.testing import assert_dataproto_equal as assert_same_rows
from roll.protocol.testing import column_values


def test_lengths_agree_or_the_error_names_the_key():
    with pytest.raises(ProtocolError, match=r"'b'.*3.*4|'b' has 3 rows"):
        DataProto.from_dict({"a": torch.zeros(4, 2), "b": torch.zeros(3)})
    with pytest.raises(ProtocolError, match=r"'text' has 2 rows but the batch has 4"):
        DataProto.from_dict({"a": torch.zeros(4)}, {"text": ["x", "y"]})
    with pytest.raises(ProtocolError, match="scalar"):
        DataProto.from_dict({"a": torch.tensor(1.0)})
    dp = DataProto.from_dict({"a": torch.zeros(4)})
    with pytest.raises(ProtocolError, match=r"'extra' has 5 rows but the DataProto has 4"):
        dp["extra"] = torch.zeros(5)
    with pytest.raises(ProtocolError, match=r"'c' has 3 rows"):
        dp.non_tensor_batch["c"] = ["x", "y", "z"]


def test_from_single_dict_splits_tensors_and_columns(mixed):
    dp = DataProto.from_single_dict({"x": torch.ones(2, 3), "name": np.array(["a", "b"], dtype=object), "n": [1, 2]})
    assert list(dp.batch.keys()) == ["x"]
    assert sorted(dp.non_tensor_batch) == ["n", "name"]
    assert dp["name"].tolist() == ["a", "b"]
    assert dp["n"].tolist() == [1, 2]
    only_columns = DataProto.from_dict(non_tensors={"s": ["a", "b", "c"]})
    assert len(only_columns) == 3
    assert len(DataProto(meta_info={"metrics": {"loss": 1.0}})) == 0


def test_getitem_forms(mixed):
    assert mixed[2]["prompt"].tolist() == ["prompt 2"]
    assert mixed[-1]["prompt"].tolist() == ["prompt 6"]
    assert column_values(mixed[1:4], "prompt") == ["prompt 1", "prompt 2", "prompt 3"]
    assert column_values(mixed[::3], "prompt") == ["prompt 0", "prompt 3", "prompt 6"]
    assert column_values(mixed[[4, 0, 4]], "tag") == ["code", "math", "code"]
    assert column_values(mixed[torch.tensor([1, 2])], "answers") == [[1, 2], []]
    mask = np.array([True, False, True, False, False, False, True])
    assert column_values(mixed[mask], "prompt") == ["prompt 0", "prompt 2", "prompt 6"]
    assert torch.equal(mixed["input_ids"], mixed.batch["input_ids"])
    assert mixed["tag"][3] is None
    with pytest.raises(IndexError):
        mixed[7]
    with pytest.raises(KeyError, match="neither"):
        mixed["nope"]
    with pytest.raises(ProtocolError, match="out of range"):
        mixed[[0, 9]]
    with pytest.raises(ProtocolError, match="boolean row mask"):
        mixed[np.array([True, False])]


def test_chunk_is_uneven_and_shares_storage(mixed):
    parts = mixed.chunk(3)
    assert [len(p) for p in parts] == [len(a) for a in np.array_split(np.arange(7), 3)]
    base = mixed.batch["input_ids"]
    for part in parts:
        # A view: the part's tensor lives inside the original storage.
        assert part.batch["input_ids"].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert_same_rows(DataProto.concat(parts), mixed)
    assert [len(p) for p in mixed.chunk(9)] == [1] * 7 + [0, 0]
    assert [len(p) for p in mixed.split(3)] == [3, 3, 1]
    with pytest.raises(ProtocolError):
        mixed.chunk(0)


def test_concat_merges_metrics_and_keeps_first_meta():
    parts = [
        DataProto.from_dict({"x": torch.zeros(2)}, meta_info={"metrics": {"loss": 1.0, "lr": [0.1]}, "step": 1}),
        DataProto.from_dict({"x": torch.ones(1)}, meta_info={"metrics": {"loss": 2.0, "acc": 0.5}, "step": 2}),
    ]
    out = DataProto.concat(parts)
    assert out.meta_info["step"] == 1
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0], "lr": [0.1], "acc": [0.5]}
    assert out["x"].tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(ProtocolError, match="part 1 has keys"):
        DataProto.concat([parts[0], DataProto.from_dict({"y": torch.zeros(1)})])
    metric_only = DataProto.concat(
        [DataProto(meta_info={"metrics": {"a": 1}}), DataProto(meta_info={"metrics": {"a": 2}})]
    )
    assert len(metric_only) == 0 and metric_only.meta_info["metrics"] == {"a": [1, 2]}


def test_concat_of_arrow_columns_chains_chunks_without_copying():
    a = DataProto.from_dict(non_tensors={"s": ["x" * 100] * 3})
    b = DataProto.from_dict(non_tensors={"s": ["y" * 100] * 2})
    out = DataProto.concat([a, b])
    column = out.non_tensor_batch.column("s")
    assert isinstance(column, pa.ChunkedArray) and column.num_chunks == 2
    first_chunk = a.non_tensor_batch.column("s").chunk(0)
    assert column.chunk(0).buffers()[2].address == first_chunk.buffers()[2].address


def test_concat_unifies_null_and_typed_chunks():
    a = DataProto.from_dict(non_tensors={"v": [None, None]})
    b = DataProto.from_dict(non_tensors={"v": ["x", None]})
    assert DataProto.concat([a, b])["v"].tolist() == [None, None, "x", None]
    c = DataProto.from_dict(non_tensors={"v": [1, 2]})
    d = DataProto.from_dict(non_tensors={"v": [{"k": "v"}, 3]})
    assert column_values(DataProto.concat([c, d]), "v") == [1, 2, {"k": "v"}, 3]


def test_repeat_interleaved_and_tiled(mixed):
    small = mixed[:2]
    assert column_values(small.repeat(3), "prompt") == ["prompt 0"] * 3 + ["prompt 1"] * 3
    assert column_values(small.repeat(2, interleave=False), "prompt") == ["prompt 0", "prompt 1"] * 2
    assert small.repeat(3)["input_ids"].shape == (6, 4)


def test_select_pop_rename_union(mixed):
    picked = mixed.select(["input_ids"], ["tag"], ["global_step"])
    assert list(picked.batch.keys()) == ["input_ids"] and list(picked.non_tensor_batch) == ["tag"]
    assert picked.meta_info == {"global_step": 3}
    assert sorted(mixed.select().keys()) == sorted(mixed.keys())
    with pytest.raises(ProtocolError, match="no tensor keys"):
        mixed.select(["missing"])
    deep = mixed.select(["input_ids"], deepcopy=True)
    deep.batch["input_ids"][0, 0] = -1
    assert mixed["input_ids"][0, 0] == 0

    popped = mixed.pop(batch_keys=["log_probs"], non_tensor_batch_keys="score")
    assert "log_probs" not in mixed and "score" not in mixed
    assert sorted(popped.keys()) == ["log_probs", "score"]

    mixed.rename("input_ids", "ids").rename(["tag"], ["domain"])
    assert "ids" in mixed and "domain" in mixed and "tag" not in mixed
    with pytest.raises(ProtocolError, match="already exists"):
        mixed.rename("ids", "prompt")

    mixed.union(popped)
    assert "log_probs" in mixed and mixed["score"].tolist() == popped["score"].tolist()
    mixed.union(popped)  # equal duplicates are fine
    conflicting = popped.clone()
    conflicting.batch["log_probs"][0, 0] = 123.0
    with pytest.raises(ProtocolError, match="tensor 'log_probs' differs"):
        mixed.union(conflicting)
    other_text = DataProto.from_dict(non_tensors={"prompt": ["other"] * len(mixed)})
    with pytest.raises(ProtocolError, match="column 'prompt' differs"):
        mixed.union(other_text)
    with pytest.raises(ProtocolError, match=r"meta_info\['global_step'\] differs"):
        mixed.union(DataProto(batch=TensorDict({}, batch_size=[len(mixed)]), meta_info={"global_step": 9}))
    with pytest.raises(ProtocolError, match="7 and 2 rows"):
        mixed.union(mixed[:2])


def test_group_by_reorder_and_iterator(mixed):
    groups = mixed.group_by("tag")
    assert list(groups) == ["math", "code", None, "qa"]
    assert column_values(groups["math"], "prompt") == ["prompt 0", "prompt 2", "prompt 5"]
    by_tensor = DataProto.from_dict({"g": torch.tensor([1, 0, 1])}).group_by("g")
    assert {k: len(v) for k, v in by_tensor.items()} == {1: 2, 0: 1}
    with pytest.raises(ProtocolError, match="hashable"):
        mixed.group_by("answers")

    dp = DataProto.from_dict({"x": torch.arange(5)})
    dp.reorder([4, 3, 2, 1, 0])
    assert dp["x"].tolist() == [4, 3, 2, 1, 0]
    with pytest.raises(ProtocolError, match="permutation"):
        dp.reorder([0, 0, 1, 2, 3])

    batches = list(DataProto.from_dict({"x": torch.arange(10)}).make_iterator(4, epochs=2, seed=7))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    first_epoch = torch.cat([b["x"] for b in batches[:3]])
    second_epoch = torch.cat([b["x"] for b in batches[3:]])
    assert sorted(first_epoch.tolist()) == list(range(10)) == sorted(second_epoch.tolist())
    assert first_epoch.tolist() != second_epoch.tolist()
    again = list(DataProto.from_dict({"x": torch.arange(10)}).make_iterator(4, epochs=2, seed=7))
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(batches, again))


def test_pad_and_unpad(mixed):
    padded, pad = pad_dataproto_to_divisor(mixed, 4)
    assert (len(padded), pad) == (8, 1)
    assert column_values(padded, "prompt")[-1] == "prompt 0"
    assert_same_rows(unpad_dataproto(padded, pad), mixed)
    tiny = mixed[:2]
    padded, pad = pad_dataproto_to_divisor(tiny, 7)
    assert pad == 5 and column_values(padded, "prompt") == ["prompt 0", "prompt 1"] * 3 + ["prompt 0"]
    same, zero = pad_dataproto_to_divisor(mixed, 7)
    assert same is mixed and zero == 0


def test_non_tensor_storage_kinds_and_read_only_views():
    dp = DataProto.from_dict(
        non_tensors={
            "text": ["a", "b"],
            "ints": np.array([1, 2]),
            "matrix": np.zeros((2, 3)),
            "nested": [[{"role": "user", "content": "hi"}], []],
            "ragged_records": [{"a": 1}, {"b": 2}],
            "objects": [object(), object()],
        }
    )
    kinds = {k: dp.non_tensor_batch.storage_kind(k) for k in dp.non_tensor_batch}
    assert kinds == {
        "text": "arrow",
        "ints": "numpy",
        "matrix": "numpy",
        "nested": "arrow",
        "ragged_records": "object",
        "objects": "object",
    }
    # Arrow would invent keys for records with different fields: such columns stay Python objects, unchanged.
    assert dp["ragged_records"].tolist() == [{"a": 1}, {"b": 2}]
    assert dp["nested"][0] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="read-only"):
        dp["ints"][0] = 5
    dp.non_tensor_batch["ints"] = np.array([7, 8])
    assert dp["ints"].tolist() == [7, 8]
    assert dp.non_tensor_batch.table().column_names == ["text", "nested"]
    assert isinstance(dp.non_tensor_batch, NonTensorBatch)


def test_batch_setter_and_setitem_route_by_type(mixed):
    mixed["new_tensor"] = torch.zeros(7)
    mixed["new_text"] = ["t"] * 7
    assert "new_tensor" in mixed.batch.keys() and "new_text" in mixed.non_tensor_batch
    with pytest.raises(ProtocolError, match="already a non-tensor"):
        mixed["new_text"] = torch.zeros(7)
    mixed.batch = mixed.batch.to("cpu")
    with pytest.raises(ProtocolError, match="3 rows"):
        mixed.batch = {"x": torch.zeros(3)}
    del mixed["new_text"]
    assert "new_text" not in mixed


def test_clone_is_deep_and_to_moves(mixed):
    copy = mixed.clone()
    copy.batch["input_ids"][0, 0] = 99
    copy.meta_info["global_step"] = 4
    assert mixed["input_ids"][0, 0] == 0 and mixed.meta_info["global_step"] == 3
    assert mixed.to("cpu") is mixed


def test_concat_and_select_keep_exotic_dtypes_and_fall_back_for_autograd():
    dp = DataProto.from_dict(
        {
            "bf16": torch.randn(5, 3).to(torch.bfloat16),
            "flags": torch.tensor([True, False, True, True, False]),
            "grad": torch.randn(5, 2, requires_grad=True),
        }
    )
    joined = DataProto.concat(dp.chunk(2))
    picked = dp.select_idxs([4, 0, 0])
    for key in ("bf16", "flags"):
        assert joined[key].dtype == dp[key].dtype and torch.equal(joined[key], dp[key])
        assert torch.equal(picked[key], dp[key][[4, 0, 0]])
    assert picked["grad"].requires_grad and torch.equal(picked["grad"], dp["grad"][[4, 0, 0]])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_concat_shares_large_copies_among_threads_and_keeps_every_row(monkeypatch, threads):
    from roll.protocol import _tensor_ops

    # Make the threaded path run on small data: blocks of a few rows, shared among up to 3 threads.
    monkeypatch.setattr(_tensor_ops, "PARALLEL_COPY_MIN_BYTES", 0)
    monkeypatch.setattr(_tensor_ops, "_BLOCK_BYTES", 64)
    monkeypatch.setattr(_tensor_ops.os, "cpu_count", lambda: 4)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = DataProto.from_dict(
            {
                "ids": torch.arange(37 * 5).reshape(37, 5),
                "logp": torch.randn(37, 3, dtype=torch.bfloat16),
                "flag": torch.arange(37) % 2 == 0,
            },
            {"text": [f"row {i}" for i in range(37)]},
        )
        parts = [full.slice(0, 1), full.slice(1, 20), full.slice(20, 20), full.slice(20, 37)]
        joined = DataProto.concat([p.clone() for p in parts])
    finally:
        torch.set_num_threads(previous)
    assert_same_rows(joined, full)
