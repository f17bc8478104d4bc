"""DataProto without torch: non-tensor columns and meta_info work, tensor features name the extra to install.

Each case runs in a fresh interpreter: one where torch is importable but must not be imported, and one where
importing torch or tensordict fails as in an environment without the ``roll-protocol[torch]`` extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

BLOCK_TORCH = "import sys\nsys.modules['torch'] = None\nsys.modules['tensordict'] = None\n"

NON_TENSOR_WORK = """
import pickle
import numpy as np
from roll.protocol import DataProto, Dispatch, RankInfo, pad_dataproto_to_divisor, unpad_dataproto

data = DataProto.from_dict(
    non_tensors={"text": ["a", "bb", "ccc", "dddd", "e"], "score": np.arange(5.0), "tags": [[1], [], [2, 3], [4], []]},
    meta_info={"metrics": {"seen": 5}, "note": "hi"},
)
parts = data.chunk(2)
assert [len(p) for p in parts] == [3, 2]
joined = DataProto.concat(parts)
assert joined["text"].tolist() == ["a", "bb", "ccc", "dddd", "e"]
assert joined.meta_info["metrics"] == {"seen": [5, 5]}
assert data.select_idxs([4, 0])["text"].tolist() == ["e", "a"]
assert data.select_idxs(np.array([True, False, True, False, False]))["score"].tolist() == [0.0, 2.0]
assert data.repeat(2, interleave=False)["text"].tolist()[:6] == ["a", "bb", "ccc", "dddd", "e", "a"]
assert data[1:3]["tags"].tolist() == [[], [2, 3]] and data[::2]["text"].tolist() == ["a", "ccc", "e"]
assert sorted(data.group_by("text")) == ["a", "bb", "ccc", "dddd", "e"]
copy = pickle.loads(pickle.dumps(data, protocol=5))
assert copy["tags"].tolist() == [[1], [], [2, 3], [4], []] and copy.meta_info["note"] == "hi"
padded, pad = pad_dataproto_to_divisor(data, 4)
assert len(padded) == 8 and len(unpad_dataproto(padded, pad)) == 5
data["upper"] = [t.upper() for t in data["text"]]
data.union(DataProto.from_dict(non_tensors={"text": data["text"]}))
assert data.select(non_tensor_batch_keys=["upper"]).keys() == ["upper"]
assert data.pop(non_tensor_batch_keys="upper").keys() == ["upper"] and "upper" not in data
assert data.clone().to("cpu")["score"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
assert [len(b) for b in data.make_iterator(2, seed=1)] == [2, 2, 1]
shards = Dispatch.DP_MP_COMPUTE.dispatch((data,), {}, [RankInfo(rank=r, world_size=2) for r in range(2)])
assert [len(args[0]) for args, _ in shards] == [3, 2]
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    # The child sees the modules this process sees, however the test runner laid them out (venv, Pants sandbox).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env
    )


def test_non_tensor_dataprotos_never_import_torch():
    result = run_python(NON_TENSOR_WORK + "\nimport sys\nassert 'torch' not in sys.modules, 'torch was imported'\n")
    assert result.returncode == 0, result.stderr


def test_non_tensor_dataprotos_work_without_torch_installed():
    result = run_python(BLOCK_TORCH + NON_TENSOR_WORK)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("feature", "code"),
    [
        ("DataProto.batch", "data.batch"),
        ("DataProto tensors", "DataProto.from_dict(tensors={'x': [1, 2]})"),
        ("DataProto tensors", "DataProto(batch={'x': [1, 2]})"),
    ],
)
def test_tensor_features_without_torch_name_the_extra(feature, code):
    result = run_python(
        BLOCK_TORCH
        + "from roll.protocol import DataProto, MissingExtraError\n"
        + "data = DataProto.from_dict(non_tensors={'text': ['a', 'b']})\n"
        + f"try:\n    {code}\nexcept MissingExtraError as e:\n    print(e)\nelse:\n    raise SystemExit('no error')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"{feature} needs an optional dependency that is not installed (no module named 'torch'). "
        "Install it with: pip install 'roll-protocol[torch]'"
    )


def test_the_batch_property_turns_into_a_tensordict_on_demand():
    import torch

    from roll.protocol import DataProto, NoTensors

    data = DataProto.from_dict(non_tensors={"text": ["a", "b", "c"]})
    assert isinstance(data._batch, NoTensors) and len(data) == 3
    data.batch["ids"] = torch.arange(3)  # the ROLL idiom keeps working
    assert data["ids"].tolist() == [0, 1, 2] and data.batch.batch_size == torch.Size([3])
    parts = data.chunk(2)
    assert [p["ids"].tolist() for p in parts] == [[0, 1], [2]]
    mixed = DataProto.concat([DataProto.from_dict(non_tensors={"text": ["x"]}), data.select([], ["text"])])
    assert isinstance(mixed._batch, NoTensors) and mixed["text"].tolist() == ["x", "a", "b", "c"]
