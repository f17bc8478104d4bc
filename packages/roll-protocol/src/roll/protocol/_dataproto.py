"""DataProto: one batch of rows travelling between roles.

Three parts that always agree on length:

* ``batch``: a TensorDict with exactly one batch dimension (token ids, masks, log-probs, ...);
* ``non_tensor_batch``: Arrow-backed columns (prompt text, nested records, ...), read as numpy arrays;
* ``meta_info``: a dict of metrics and user-level data, not split by rows.

The tensor section needs torch and tensordict (``pip install 'roll-protocol[torch]'``). Without them a DataProto
holds non-tensor columns and meta_info, and torch is imported only when a tensor is involved: a DataProto without
tensors keeps just its row count there (``NoTensors``) until ``.batch`` is asked for.

Row operations that can be views are views (``chunk``, ``split``, ``slice``); operations that must gather rows
copy exactly once (``select_idxs``, ``repeat``, ``concat``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np

from roll.protocol._columns import (
    Column,
    NonTensorBatch,
    columns_equal,
    compact_column,
    concat_columns,
)
from roll.protocol._optional import is_tensor, is_tensordict, tensors
from roll.protocol.errors import ProtocolError

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    Index: TypeAlias = int | slice | Sequence[int] | np.ndarray | torch.Tensor
    TensorSection: TypeAlias = "TensorDict | NoTensors"


class NoTensors:
    """The tensor section of a DataProto without tensors: only its row count, no torch needed.

    Offers the few TensorDict members DataProto reads (``batch_size``, ``keys``, ``items``, ``device``).
    """

    __slots__ = ("batch_size",)

    device = None

    def __init__(self, length: int) -> None:
        self.batch_size = (length,)

    def keys(self) -> list[str]:
        return []

    def items(self) -> list[tuple[str, Any]]:
        return []

    def __repr__(self) -> str:
        return f"NoTensors(rows={self.batch_size[0]})"


def _make_batch(tensors_by_key: dict[str, Any], length: int) -> TensorSection:
    """The tensor section holding ``tensors_by_key`` (all with ``length`` rows)."""
    if not tensors_by_key:
        return NoTensors(length)
    batch: TensorDict = tensors("DataProto tensors").TensorDict(tensors_by_key, batch_size=[length])
    return batch


def _tensor_keys(batch: TensorSection) -> list[str]:
    """The tensor keys (DataProto's keys are plain strings; TensorDict's type allows nested tuples)."""
    return cast("list[str]", list(batch.keys()))


def _as_list(keys: str | Iterable[str] | None) -> list[str] | None:
    if keys is None:
        return None
    return [keys] if isinstance(keys, str) else list(keys)


def _merge_metrics(values: list[Any]) -> Any:
    """Metrics of several parts: dicts become one dict of lists (lists extend, scalars append)."""
    if not all(isinstance(v, Mapping) for v in values):
        return [x for v in values for x in (v if isinstance(v, list) else [v])]
    merged: dict[str, list[Any]] = {}
    for value in values:
        for key, metric in value.items():
            bucket = merged.setdefault(key, [])
            if isinstance(metric, list):
                bucket.extend(metric)
            else:
                bucket.append(metric)
    return merged


class DataProto:
    """A batch of rows: tensors, non-tensor columns and meta information. See the module docstring."""

    __slots__ = ("_batch", "_non_tensor", "meta_info")

    def __init__(
        self,
        batch: TensorDict | NoTensors | Mapping[str, torch.Tensor] | None = None,
        non_tensor_batch: NonTensorBatch | Mapping[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> None:
        self.meta_info: dict[str, Any] = dict(meta_info) if meta_info else {}
        section: TensorSection | None
        if batch is None or type(batch) is NoTensors or is_tensordict(batch):
            section = batch
        elif isinstance(batch, Mapping):
            section = tensors("DataProto tensors").tensordict_from(dict(batch)) if batch else None
        else:
            raise ProtocolError(
                f"DataProto batch must be a TensorDict or a dict of tensors, got {type(batch).__name__}"
            )
        if section is not None and len(section.batch_size) != 1:
            raise ProtocolError(
                f"DataProto.batch must have exactly one batch dimension, got batch_size {section.batch_size}"
            )
        length = None if section is None else int(section.batch_size[0])
        if isinstance(non_tensor_batch, NonTensorBatch):
            columns = non_tensor_batch
            if length is not None and len(columns) and columns.num_rows != length:
                key = next(iter(columns))
                self._check_column_length(key, columns.num_rows or 0, length)
        else:
            columns = NonTensorBatch(length=length)
            for key, values in (non_tensor_batch or {}).items():
                columns[key] = values
        if section is None:
            section = NoTensors(columns.num_rows or 0)
        columns._length = int(section.batch_size[0])
        self._batch: TensorSection = section
        self._non_tensor = columns
        self._check_disjoint()

    # --- construction -----------------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build from tensors (one batch dimension, equal lengths) and non-tensor columns of the same length."""
        return cls(dict(tensors) if tensors else None, dict(non_tensors or {}), meta_info)

    @classmethod
    def from_single_dict(cls, data: Mapping[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build from one dict: tensors go to ``batch``, everything else (arrays, lists) to ``non_tensor_batch``."""
        tensor_values = {k: v for k, v in data.items() if is_tensor(v)}
        others = {k: v for k, v in data.items() if not is_tensor(v)}
        return cls.from_dict(tensor_values, others, meta_info)

    # --- basic protocol ---------------------------------------------------------------------------------
    @property
    def batch(self) -> TensorDict:
        """The tensors, as a TensorDict with one batch dimension (needs ``roll-protocol[torch]``)."""
        batch = self._batch
        if type(batch) is NoTensors:
            batch = self._batch = tensors("DataProto.batch").TensorDict({}, batch_size=[len(self)])
        return cast("TensorDict", batch)

    @batch.setter
    def batch(self, value: TensorDict | Mapping[str, torch.Tensor]) -> None:
        td: TensorDict = value if is_tensordict(value) else tensors("DataProto.batch").tensordict_from(dict(value))
        if len(td.batch_size) != 1:
            raise ProtocolError(
                f"DataProto.batch must have exactly one batch dimension, got batch_size {td.batch_size}"
            )
        if len(self._non_tensor) and td.batch_size[0] != len(self):
            raise ProtocolError(f"new batch has {td.batch_size[0]} rows but the non-tensor columns have {len(self)}")
        self._batch = td
        self._non_tensor._length = int(td.batch_size[0])

    @property
    def non_tensor_batch(self) -> NonTensorBatch:
        return self._non_tensor

    @non_tensor_batch.setter
    def non_tensor_batch(self, value: Mapping[str, Any]) -> None:
        columns = NonTensorBatch(length=len(self))
        for key, values in value.items():
            self._check_column_length(key, len(values), len(self))
            columns[key] = values
        self._non_tensor = columns

    def __len__(self) -> int:
        return int(self._batch.batch_size[0])

    def __contains__(self, key: object) -> bool:
        return key in self._batch.keys() or key in self._non_tensor

    def keys(self) -> list[str]:
        return _tensor_keys(self._batch) + list(self._non_tensor)

    def __repr__(self) -> str:
        shapes = {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in self._batch.items()}
        columns = {k: self._non_tensor.storage_kind(k) for k in self._non_tensor}
        return f"DataProto(rows={len(self)}, tensors={shapes}, non_tensors={columns}, meta_info={list(self.meta_info)})"

    def __getitem__(self, item: Index | str) -> Any:
        if isinstance(item, str):
            if item in self._batch.keys():
                return self.batch[item]
            if item in self._non_tensor:
                return self._non_tensor[item]
            raise KeyError(f"{item!r} is neither a tensor nor a non-tensor key; keys: {self.keys()}")
        if isinstance(item, (int, np.integer)):
            index = int(item)
            if not -len(self) <= index < len(self):
                raise IndexError(f"row {index} is out of range for a DataProto of {len(self)} rows")
            index %= len(self)
            return self.slice(index, index + 1)
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            return self.slice(start, stop, step)
        return self.select_idxs(item)

    def __setitem__(self, key: str, value: Any) -> None:
        if is_tensor(value):
            if key in self._non_tensor:
                raise ProtocolError(f"{key!r} is already a non-tensor column; delete it before storing a tensor")
            self._check_column_length(key, value.shape[0] if value.dim() else -1, len(self))
            self.batch[key] = value
        else:
            if key in self._batch.keys():
                raise ProtocolError(f"{key!r} is already a tensor; delete it before storing a non-tensor column")
            self._check_column_length(key, len(value), len(self))
            self._non_tensor[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self._batch.keys():
            del self.batch[key]
        elif key in self._non_tensor:
            del self._non_tensor[key]
        else:
            raise KeyError(key)

    # --- row selection (views where possible) -----------------------------------------------------------
    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step``. A contiguous range (step 1) is a view; a strided one gathers rows."""
        start, end, step = slice(start, end, step).indices(len(self))
        if step != 1:
            return self.select_idxs(np.arange(start, end, step))
        end = max(start, end)
        batch = self.batch[start:end] if self._batch.keys() else NoTensors(end - start)
        return DataProto(batch, self._non_tensor._slice(start, end), self.meta_info)

    def select_idxs(self, idxs: Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows by integer indices (any order, repeats allowed) or by a boolean mask of length ``len(self)``."""
        index = _normalize_index(idxs, len(self))
        if self._batch.keys():
            take_rows = tensors("DataProto.select_idxs").take_rows
            gathered = {k: take_rows(v, index) for k, v in self._batch.items()}
        else:
            gathered = {}
        return DataProto(_make_batch(gathered, len(index)), self._non_tensor._take(index), self.meta_info)

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` parts with sizes as ``np.array_split`` gives (uneven allowed). Parts are views."""
        if chunks < 1:
            raise ProtocolError(f"chunk() needs chunks >= 1, got {chunks}")
        base, extra = divmod(len(self), chunks)
        return self._split_views([base + (1 if i < extra else 0) for i in range(chunks)])

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` rows (the last may be smaller). Parts are views."""
        if split_size < 1:
            raise ProtocolError(f"split() needs split_size >= 1, got {split_size}")
        full, rest = divmod(len(self), split_size)
        return self._split_views([split_size] * full + ([rest] if rest else []))

    def _split_views(self, sizes: list[int]) -> list[DataProto]:
        """Consecutive views of ``sizes[i]`` rows (``sum(sizes) == len(self)``): one split per tensor, and parts that
        are consistent by construction skip the checks of ``__init__``."""
        views = {k: v.split(sizes) for k, v in self._batch.items()}
        unchecked = tensors("DataProto.chunk").tensordict_unchecked if views else None
        device = self._batch.device
        out, start = [], 0
        for i, size in enumerate(sizes):
            batch = (
                NoTensors(size) if unchecked is None else unchecked({k: p[i] for k, p in views.items()}, size, device)
            )
            out.append(DataProto._unchecked(batch, self._non_tensor._slice(start, start + size), self.meta_info))
            start += size
        return out

    @classmethod
    def _unchecked(cls, batch: TensorSection, columns: NonTensorBatch, meta_info: dict[str, Any]) -> DataProto:
        """A DataProto from parts whose lengths and keys already agree (internal fast path)."""
        out = cls.__new__(cls)
        out._batch, out._non_tensor, out.meta_info = batch, columns, dict(meta_info)
        return out

    @staticmethod
    def concat(parts: Sequence[DataProto]) -> DataProto:
        """Rows of all parts in order. ``meta_info["metrics"]`` is merged across parts (dict of lists); every other
        meta key comes from the first part."""
        parts = list(parts)
        if not parts:
            raise ProtocolError("concat() needs at least one DataProto")
        first = parts[0]
        tensor_keys = _tensor_keys(first._batch)
        column_keys = list(first._non_tensor)
        for i, part in enumerate(parts[1:], start=1):
            if sorted(part._batch.keys()) != sorted(tensor_keys) or sorted(part._non_tensor) != sorted(column_keys):
                raise ProtocolError(
                    f"concat(): part {i} has keys {sorted(part.keys())} but part 0 has {sorted(first.keys())}"
                )
        total = sum(len(p) for p in parts)
        if not tensor_keys:
            joined: dict[str, Any] = {}
        elif len(parts) == 1:
            # Nothing to join: share the storage (only meta_info is normalized below).
            joined = {k: first.batch[k] for k in tensor_keys}
        else:
            cat_rows_many = tensors("DataProto.concat").cat_rows_many
            joined = cat_rows_many({k: [p.batch[k] for p in parts] for k in tensor_keys})
        batch = _make_batch(joined, total)
        columns = NonTensorBatch._from_columns(
            {k: concat_columns(k, [p._non_tensor.column(k) for p in parts]) for k in column_keys}, total
        )
        meta = dict(first.meta_info)
        metrics = [p.meta_info["metrics"] for p in parts if "metrics" in p.meta_info]
        if metrics:
            meta["metrics"] = _merge_metrics(metrics)
        return DataProto(batch, columns, meta)

    def repeat(self, repeat_times: int, interleave: bool = True) -> DataProto:
        """Each row ``repeat_times`` times: ``a a b b`` when interleaved, ``a b a b`` when tiled."""
        if repeat_times < 1:
            raise ProtocolError(f"repeat() needs repeat_times >= 1, got {repeat_times}")
        rows = np.arange(len(self))
        index = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return self.select_idxs(index)

    def reorder(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Permute rows in place (``indices`` is a permutation of ``range(len(self))``); returns self."""
        index = _normalize_index(indices, len(self))
        if len(index) != len(self) or not np.array_equal(np.sort(index), np.arange(len(self))):
            raise ProtocolError(f"reorder() needs a permutation of range({len(self)}), got {len(index)} indices")
        reordered = self.select_idxs(index)
        self._batch, self._non_tensor = reordered._batch, reordered._non_tensor
        return self

    def group_by(self, key: str) -> dict[Any, DataProto]:
        """Split rows by the value of one column (tensor of one value per row, or non-tensor), in first-seen order."""
        values = self[key]
        if is_tensor(values):
            if values.dim() != 1:
                raise ProtocolError(
                    f"group_by({key!r}) needs one value per row, got a tensor of shape {tuple(values.shape)}"
                )
            values = values.numpy()
        groups: dict[Any, list[int]] = {}
        try:
            for i, value in enumerate(values.tolist() if values.dtype != object else values):
                groups.setdefault(value, []).append(i)
        except TypeError as e:
            raise ProtocolError(f"group_by({key!r}): values must be hashable ({e})") from e
        return {value: self.select_idxs(np.asarray(rows, dtype=np.int64)) for value, rows in groups.items()}

    # --- key selection ----------------------------------------------------------------------------------
    def select(
        self,
        batch_keys: str | Iterable[str] | None = None,
        non_tensor_batch_keys: str | Iterable[str] | None = None,
        meta_info_keys: str | Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the given keys (``None`` keeps every key of that kind). Shares storage."""
        tensor_keys = _as_list(batch_keys)
        column_keys = _as_list(non_tensor_batch_keys)
        meta_keys = _as_list(meta_info_keys)
        self._check_keys(tensor_keys, _tensor_keys(self._batch), "tensor")
        self._check_keys(column_keys, list(self._non_tensor), "non-tensor")
        self._check_keys(meta_keys, list(self.meta_info), "meta_info")
        keys = _tensor_keys(self._batch) if tensor_keys is None else tensor_keys
        batch = _make_batch({k: self.batch[k] for k in keys}, len(self))
        columns = self._non_tensor._select(list(self._non_tensor) if column_keys is None else column_keys)
        meta = dict(self.meta_info) if meta_keys is None else {k: self.meta_info[k] for k in meta_keys}
        out = DataProto(batch, columns, meta)
        return out.clone() if deepcopy else out

    def pop(
        self,
        batch_keys: str | Iterable[str] | None = None,
        non_tensor_batch_keys: str | Iterable[str] | None = None,
        meta_info_keys: str | Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the given keys from this DataProto and return them as a new one (``None`` pops nothing)."""
        tensor_keys = _as_list(batch_keys) or []
        column_keys = _as_list(non_tensor_batch_keys) or []
        meta_keys = _as_list(meta_info_keys) or []
        out = self.select(tensor_keys, column_keys, meta_keys)
        for key in tensor_keys:
            del self.batch[key]
        for key in column_keys:
            del self._non_tensor[key]
        for key in meta_keys:
            del self.meta_info[key]
        return out

    def rename(self, old_keys: str | Iterable[str], new_keys: str | Iterable[str]) -> DataProto:
        """Rename tensor or non-tensor keys in place; returns self."""
        old, new = _as_list(old_keys) or [], _as_list(new_keys) or []
        if len(old) != len(new):
            raise ProtocolError(f"rename() got {len(old)} old keys but {len(new)} new keys")
        for before, after in zip(old, new):
            if after in self and after != before:
                raise ProtocolError(f"rename(): {after!r} already exists")
            if before in self._batch.keys():
                self.batch.rename_key_(before, after)
            elif before in self._non_tensor:
                column = self._non_tensor.column(before)
                del self._non_tensor[before]
                self._non_tensor[after] = column
            else:
                raise ProtocolError(f"rename(): no key {before!r}; keys: {self.keys()}")
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s keys to this DataProto in place. Keys present in both must hold equal values."""
        if len(other) != len(self):
            raise ProtocolError(f"union() of DataProtos with {len(self)} and {len(other)} rows")
        for key, tensor in other._batch.items():
            if key in self._non_tensor:
                raise ProtocolError(f"union(): {key!r} is a tensor in one DataProto and a non-tensor in the other")
            if key in self._batch.keys():
                if not tensors("DataProto.union").tensors_equal(self.batch[key], tensor):
                    raise ProtocolError(f"union(): tensor {key!r} differs between the two DataProtos")
            else:
                self.batch[key] = tensor
        for key in other._non_tensor:
            if key in self._batch.keys():
                raise ProtocolError(f"union(): {key!r} is a tensor in one DataProto and a non-tensor in the other")
            theirs = other._non_tensor.column(key)
            if key in self._non_tensor:
                if not columns_equal(self._non_tensor.column(key), theirs):
                    raise ProtocolError(f"union(): non-tensor column {key!r} differs between the two DataProtos")
            else:
                self._non_tensor[key] = theirs
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _meta_equal(self.meta_info[key], value):
                raise ProtocolError(f"union(): meta_info[{key!r}] differs between the two DataProtos")
            self.meta_info.setdefault(key, value)
        return self

    # --- devices, copies, iteration ---------------------------------------------------------------------
    def to(self, device: str | torch.device) -> DataProto:
        """Move tensors (and tensors in meta_info) to ``device`` in place; returns self."""
        if self._batch.keys():
            self._batch = self.batch.to(device)
        self.meta_info = {k: v.to(device) if is_tensor(v) else v for k, v in self.meta_info.items()}
        return self

    def clone(self) -> DataProto:
        """A deep copy: new tensor storage, own columns, a deep-copied meta_info.

        Arrow columns are immutable, so they are shared (compacted to this DataProto's rows), not copied.
        """
        batch = _make_batch({k: v.clone() for k, v in self._batch.items()}, len(self))
        columns = NonTensorBatch._from_columns(
            {k: _copy_column(self._non_tensor.column(k)) for k in self._non_tensor}, len(self)
        )
        return DataProto(batch, columns, copy.deepcopy(self.meta_info))

    def make_iterator(self, mini_batch_size: int, epochs: int = 1, seed: int | None = None) -> Iterator[DataProto]:
        """Mini-batches over ``epochs`` passes (PPO epochs). Rows are shuffled per epoch when ``seed`` is given
        (deterministically from ``seed`` and the epoch); the last mini-batch of an epoch may be smaller."""
        if mini_batch_size < 1 or epochs < 1:
            raise ProtocolError(
                f"make_iterator() needs mini_batch_size >= 1 and epochs >= 1, got {mini_batch_size}, {epochs}"
            )
        for epoch in range(epochs):
            if seed is None:
                order = np.arange(len(self))
            else:
                order = np.random.default_rng([seed, epoch]).permutation(len(self))
            for start in range(0, len(self), mini_batch_size):
                yield self.select_idxs(order[start : start + mini_batch_size])

    # --- pickling ---------------------------------------------------------------------------------------
    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        packed = {}
        if self._batch.keys():
            pack_tensor = tensors("pickling a DataProto").pack_tensor
            packed = {k: pack_tensor(v, protocol) for k, v in self._batch.items()}
        columns = {k: compact_column(self._non_tensor.column(k)) for k in self._non_tensor}
        return _rebuild, (len(self), packed, columns, self.meta_info)

    # --- internal checks --------------------------------------------------------------------------------
    @staticmethod
    def _check_column_length(key: str, n: int, expected: int) -> None:
        if n != expected:
            raise ProtocolError(
                f"{key!r} has {n} rows but the DataProto has {expected}; every key needs one value per row"
            )

    @staticmethod
    def _check_keys(wanted: list[str] | None, present: list[str], kind: str) -> None:
        missing = [k for k in wanted or [] if k not in present]
        if missing:
            raise ProtocolError(f"no {kind} keys {missing}; {kind} keys are {present}")

    def _check_disjoint(self) -> None:
        both = set(self._batch.keys()) & set(self._non_tensor)
        if both:
            raise ProtocolError(f"keys {sorted(both)} are both tensors and non-tensor columns")


def _copy_column(column: Column) -> Column:
    if isinstance(column, np.ndarray):
        return copy.deepcopy(column)
    return compact_column(column)


def _rebuild(
    length: int, packed: dict[str, tuple[Any, ...]], columns: dict[str, Column], meta_info: dict[str, Any]
) -> DataProto:
    if packed:
        unpack_tensor = tensors("unpickling a DataProto with tensors").unpack_tensor
        batch = _make_batch({k: unpack_tensor(*args) for k, args in packed.items()}, length)
    else:
        batch = NoTensors(length)
    return DataProto(batch, NonTensorBatch._from_columns(columns, length), meta_info)


def _normalize_index(idxs: Any, length: int) -> np.ndarray:
    if is_tensor(idxs):
        idxs = idxs.cpu().numpy()
    index = np.asarray(idxs)
    if index.dtype == bool:
        if index.shape != (length,):
            raise ProtocolError(f"a boolean row mask needs shape ({length},), got {index.shape}")
        return np.flatnonzero(index).astype(np.int64)
    if index.size == 0:
        return np.zeros(0, dtype=np.int64)
    if index.ndim != 1 or index.dtype.kind not in "iu":
        raise ProtocolError(
            f"row indices must be a 1-D integer or boolean array, got dtype {index.dtype} shape {index.shape}"
        )
    index = index.astype(np.int64, copy=False)
    if index.min() < -length or index.max() >= length:
        raise ProtocolError(
            f"row index out of range for a DataProto of {length} rows (min {index.min()}, max {index.max()})"
        )
    return np.where(index < 0, index + length, index)


def _meta_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if is_tensor(a) or is_tensor(b):
        return is_tensor(a) and is_tensor(b) and bool(tensors("DataProto.union").torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False
