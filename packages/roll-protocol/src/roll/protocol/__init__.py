"""roll.protocol: the data contract (DataProto) and the dispatch contract (Dispatch, RankInfo, register).

Depends only on numpy and pyarrow, so any process can exchange batches with roll's workers. Tensor columns need
torch and tensordict, the ``roll-protocol[torch]`` extra; torch is imported only once a tensor is involved.
"""

from __future__ import annotations

from roll.protocol._columns import NonTensorBatch
from roll.protocol._dataproto import DataProto, NoTensors
from roll.protocol._dispatch import (
    CollectFn,
    Dispatch,
    DispatchFn,
    DispatchMode,
    Execute,
    collect_ranks,
    combine_outputs,
    register_dispatch_mode,
    resolve_dispatch_mode,
    split_for_dp,
)
from roll.protocol._optional import has_tensor_extra
from roll.protocol._padding import pad_dataproto_to_divisor, unpad_dataproto
from roll.protocol._rank_info import RankInfo
from roll.protocol._register import Registration, get_registration, register
from roll.protocol.errors import MissingExtraError, ProtocolError, RollError, import_extra

__version__ = "0.1.0"

__all__ = [
    "CollectFn",
    "DataProto",
    "Dispatch",
    "DispatchFn",
    "DispatchMode",
    "Execute",
    "MissingExtraError",
    "NoTensors",
    "NonTensorBatch",
    "ProtocolError",
    "RankInfo",
    "Registration",
    "RollError",
    "collect_ranks",
    "combine_outputs",
    "get_registration",
    "has_tensor_extra",
    "import_extra",
    "pad_dataproto_to_divisor",
    "register",
    "register_dispatch_mode",
    "resolve_dispatch_mode",
    "split_for_dp",
    "unpad_dataproto",
]
