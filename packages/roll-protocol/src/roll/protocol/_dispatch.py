"""Dispatch modes: how a call's arguments are spread over a cluster's ranks and how results come back.

A mode is a pair of pure functions of the arguments and the ranks' :class:`RankInfo` list, testable without Ray:

* ``dispatch_fn(args, kwargs, rank_infos) -> [(args_r, kwargs_r) for each rank r]``
* ``collect_fn(outputs, rank_infos) -> result`` where ``outputs[r]`` is rank r's return value.

When several ranks must receive the same data (the replicas of one data-parallel shard), ``dispatch_fn`` hands
them the *same Python object*; the runtime puts each distinct object into the object store once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from roll.protocol._dataproto import DataProto
from roll.protocol._optional import is_tensor, tensors
from roll.protocol._rank_info import RankInfo
from roll.protocol.errors import ProtocolError

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
DispatchFn = Callable[[Args, Kwargs, Sequence[RankInfo]], list[tuple[Args, Kwargs]]]
CollectFn = Callable[[list[Any], Sequence[RankInfo]], Any]


@dataclass(frozen=True)
class DispatchMode:
    """A named (dispatch_fn, collect_fn) pair: built-in ones are the constants of :class:`Dispatch`, others come
    from :func:`register_dispatch_mode`."""

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn

    def dispatch(self, args: Args, kwargs: Kwargs, rank_infos: Sequence[RankInfo]) -> list[tuple[Args, Kwargs]]:
        per_rank = self.dispatch_fn(tuple(args), dict(kwargs), rank_infos)
        if len(per_rank) != len(rank_infos):
            raise ProtocolError(f"dispatch mode {self.name} produced {len(per_rank)} calls for {len(rank_infos)} ranks")
        return per_rank

    def collect(self, outputs: list[Any], rank_infos: Sequence[RankInfo]) -> Any:
        return self.collect_fn(outputs, rank_infos)

    def __repr__(self) -> str:
        return f"Dispatch.{self.name}"


_MODES: dict[str, DispatchMode] = {}


class Execute(enum.Enum):
    """Which ranks run a call: all of them, or rank 0 only."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


def register_dispatch_mode(name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> DispatchMode:
    """Add a dispatch mode and return it. Keep the returned mode as a constant of your own (it is what
    ``@register(dispatch_mode=...)`` takes); it is also found by name (``register(dispatch_mode="NAME")``,
    :meth:`Dispatch.get`). Names are unique: re-registering one is an error."""
    if not name.isidentifier():
        raise ProtocolError(f"dispatch mode name {name!r} must be a Python identifier")
    if name in _MODES:
        raise ProtocolError(f"dispatch mode {name!r} is already registered")
    mode = DispatchMode(name, dispatch_fn, collect_fn)
    _MODES[name] = mode
    return mode


def resolve_dispatch_mode(mode: DispatchMode | str) -> DispatchMode:
    """A DispatchMode from a mode or its name; unknown names raise with the list of known ones."""
    if isinstance(mode, DispatchMode):
        return mode
    if isinstance(mode, str) and mode in _MODES:
        return _MODES[mode]
    raise ProtocolError(f"unknown dispatch mode {mode!r}; known modes: {sorted(_MODES)}")


# --- helpers ------------------------------------------------------------------------------------------------
def _split_sizes(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_for_dp(value: Any, dp_size: int) -> list[Any] | None:
    """Split one argument into ``dp_size`` shards, or return None if the argument is broadcast as is.

    DataProtos, tensors, numpy arrays and lists/tuples are split along rows (uneven sizes like ``np.array_split``); other values
    (numbers, strings, dicts, None) go unchanged to every rank.
    """
    if isinstance(value, DataProto):
        return value.chunk(dp_size)
    if is_tensor(value):
        return list(tensors("splitting a tensor").torch.split(value, _split_sizes(value.shape[0], dp_size)))
    if isinstance(value, np.ndarray):
        return np.array_split(value, dp_size)
    if isinstance(value, (list, tuple)):
        out, start = [], 0
        for size in _split_sizes(len(value), dp_size):
            out.append(type(value)(value[start : start + size]))
            start += size
        return out
    return None


def _dp_topology(rank_infos: Sequence[RankInfo]) -> tuple[int, dict[int, int]]:
    """dp_size and, for each dp rank, the rank whose output is collected. Checks the topology is consistent."""
    if not rank_infos:
        raise ProtocolError("cannot dispatch to a cluster with no ranks")
    dp_sizes = {info.dp_size for info in rank_infos}
    if len(dp_sizes) != 1:
        raise ProtocolError(f"ranks disagree on dp_size: {sorted(dp_sizes)}")
    dp_size = dp_sizes.pop()
    collectors: dict[int, int] = {}
    for rank, info in enumerate(rank_infos):
        if info.is_collect_rank:
            if info.dp_rank in collectors:
                raise ProtocolError(
                    f"ranks {collectors[info.dp_rank]} and {rank} both claim to be the output rank of dp_rank {info.dp_rank}"
                )
            collectors[info.dp_rank] = rank
    missing = sorted(set(range(dp_size)) - set(collectors))
    if missing:
        raise ProtocolError(f"no rank with tp_rank 0, cp_rank 0 and the last pp stage for dp ranks {missing}")
    return dp_size, collectors


def combine_outputs(outputs: list[Any]) -> Any:
    """Merge per-replica outputs in order: DataProtos concatenate, lists flatten, all-None gives None."""
    if not outputs:
        return []
    if all(isinstance(o, DataProto) for o in outputs):
        return DataProto.concat(outputs)
    if all(isinstance(o, list) for o in outputs):
        return [x for o in outputs for x in o]
    if all(o is None for o in outputs):
        return None
    return outputs


# --- built-in modes -----------------------------------------------------------------------------------------
def _one_to_all(args: Args, kwargs: Kwargs, rank_infos: Sequence[RankInfo]) -> list[tuple[Args, Kwargs]]:
    return [(args, kwargs)] * len(rank_infos)


def _collect_all(outputs: list[Any], rank_infos: Sequence[RankInfo]) -> list[Any]:
    return list(outputs)


def _collect_rank_zero(outputs: list[Any], rank_infos: Sequence[RankInfo]) -> Any:
    return outputs[0]


def _all_to_all(args: Args, kwargs: Kwargs, rank_infos: Sequence[RankInfo]) -> list[tuple[Args, Kwargs]]:
    n = len(rank_infos)
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        if not isinstance(value, (list, tuple)) or len(value) != n:
            got = (
                f"a {type(value).__name__} of length {len(value)}"
                if isinstance(value, (list, tuple))
                else type(value).__name__
            )
            raise ProtocolError(
                f"ALL_TO_ALL needs every argument to be a list with one item per rank ({n}); {label} is {got}"
            )
    return [(tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(n)]


def _dp_mp(
    args: Args, kwargs: Kwargs, rank_infos: Sequence[RankInfo], *, first_only: bool
) -> list[tuple[Args, Kwargs]]:
    dp_size, _ = _dp_topology(rank_infos)
    split_args = [split_for_dp(a, dp_size) for a in args]
    split_kwargs = {k: split_for_dp(v, dp_size) for k, v in kwargs.items()}
    calls = []
    for info in rank_infos:
        receives = info.is_dispatch_first_rank or not first_only

        def pick(value: Any, shards: list[Any] | None, receives: bool = receives, dp: int = info.dp_rank) -> Any:
            if shards is None:
                return value
            if receives:
                return shards[dp]
            return _placeholder(shards[dp])

        rank_args = tuple(pick(a, s) for a, s in zip(args, split_args))
        rank_kwargs = {k: pick(v, split_kwargs[k]) for k, v in kwargs.items()}
        calls.append((rank_args, rank_kwargs))
    return calls


def _placeholder(shard: Any) -> Any:
    """What a non-first rank receives under DP_MP_DISPATCH_FIRST: an empty shard of the same kind."""
    if isinstance(shard, DataProto):
        return DataProto(meta_info=dict(shard.meta_info))
    if is_tensor(shard):
        return shard[:0]
    return type(shard)()


def _dp_mp_compute(args: Args, kwargs: Kwargs, rank_infos: Sequence[RankInfo]) -> list[tuple[Args, Kwargs]]:
    return _dp_mp(args, kwargs, rank_infos, first_only=False)


def _dp_mp_dispatch_first(args: Args, kwargs: Kwargs, rank_infos: Sequence[RankInfo]) -> list[tuple[Args, Kwargs]]:
    return _dp_mp(args, kwargs, rank_infos, first_only=True)


def _collect_dp_mp(outputs: list[Any], rank_infos: Sequence[RankInfo]) -> Any:
    dp_size, collectors = _dp_topology(rank_infos)
    return combine_outputs([outputs[collectors[dp]] for dp in range(dp_size)])


def collect_ranks(mode: DispatchMode, rank_infos: Sequence[RankInfo]) -> list[int]:
    """Ranks whose outputs a built-in mode keeps, in result order (all ranks for custom modes)."""
    if mode.collect_fn is _collect_dp_mp:
        dp_size, collectors = _dp_topology(rank_infos)
        return [collectors[dp] for dp in range(dp_size)]
    if mode.collect_fn is _collect_rank_zero:
        return [0]
    return list(range(len(rank_infos)))


class Dispatch:
    """The built-in dispatch modes, as typed constants.

    * ``ONE_TO_ALL``: every rank gets the same arguments; the result is the list of every rank's output.
    * ``ONE_TO_ALL_ONE``: as ONE_TO_ALL, but only rank 0's output is returned.
    * ``ALL_TO_ALL``: every argument is a list with one item per rank; the result is the list of outputs.
    * ``DP_MP_COMPUTE``: DataProtos, tensors, arrays and lists are split by data-parallel rank and replicated inside
      each model-parallel group; outputs of the collect ranks (tp 0, cp 0, last pipeline stage) are combined.
    * ``DP_MP_DISPATCH_FIRST``: as DP_MP_COMPUTE, but only the first rank of each group (tp 0, cp 0, pp 0) gets the
      data; the others get an empty shard of the same kind.

    Modes added with :func:`register_dispatch_mode` are not attributes of this class (type checkers could not see
    them): keep the mode it returns, or look it up with ``Dispatch.get(name)``.
    """

    ONE_TO_ALL: Final[DispatchMode] = register_dispatch_mode("ONE_TO_ALL", _one_to_all, _collect_all)
    ONE_TO_ALL_ONE: Final[DispatchMode] = register_dispatch_mode("ONE_TO_ALL_ONE", _one_to_all, _collect_rank_zero)
    ALL_TO_ALL: Final[DispatchMode] = register_dispatch_mode("ALL_TO_ALL", _all_to_all, _collect_all)
    DP_MP_COMPUTE: Final[DispatchMode] = register_dispatch_mode("DP_MP_COMPUTE", _dp_mp_compute, _collect_dp_mp)
    DP_MP_DISPATCH_FIRST: Final[DispatchMode] = register_dispatch_mode(
        "DP_MP_DISPATCH_FIRST", _dp_mp_dispatch_first, _collect_dp_mp
    )

    def __init__(self) -> None:
        raise TypeError("Dispatch is a namespace of constants; use Dispatch.ONE_TO_ALL, Dispatch.get(name), ...")

    @staticmethod
    def get(name: str) -> DispatchMode:
        """The mode registered as ``name`` (built-in or user-registered); unknown names list the known ones."""
        return resolve_dispatch_mode(name)

    @staticmethod
    def names() -> list[str]:
        """Every registered mode's name, sorted."""
        return sorted(_MODES)
