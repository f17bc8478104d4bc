"""Non-tensor columns of a DataProto, stored in Arrow where Arrow can hold them.

A column is kept in one of three forms:

* ``pa.ChunkedArray`` for strings, nested lists/records and anything with ``None`` in it. Slicing and
  concatenation are zero-copy (concat just chains chunks) and pickling ships the Arrow buffers out of band.
* a numeric ``np.ndarray`` (any non-object dtype, any number of dimensions): already zero-copy for numpy and
  for pickle protocol 5, so there is nothing to gain from Arrow.
* an object ``np.ndarray`` as the last resort, for per-row Python objects Arrow cannot represent faithfully.

Reading ``batch[key]`` always returns a numpy array (zero-copy for numeric data, an object array otherwise),
so code written against ROLL/verl's ``dict[str, np.ndarray]`` keeps working. Returned arrays are read-only:
assign a new array to change a column, because an in-place edit of a converted array would be lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from roll.protocol.errors import ProtocolError

# pyarrow ships no type information: for type checkers a ChunkedArray is Any.
Column: TypeAlias = "pa.ChunkedArray | np.ndarray"


def _contains_struct(type_: pa.DataType) -> bool:
    if pa.types.is_struct(type_) or pa.types.is_union(type_) or pa.types.is_map(type_):
        return True
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _contains_struct(type_.value_type)
    return False


def _object_array(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    # Element-wise so that equal-length nested lists stay lists instead of becoming a 2-D array.
    for i, value in enumerate(values):
        out[i] = value
    return out


def to_column(values: Any) -> Column:
    """Convert user-supplied column values to the storage form described in the module docstring."""
    if isinstance(values, pa.ChunkedArray):
        return values
    if isinstance(values, pa.Array):
        return pa.chunked_array([values], type=values.type)
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.dtype.kind in "US":
            return pa.chunked_array([pa.array(values.tolist())])
        return values
    if isinstance(values, (np.ndarray, list, tuple)):
        pylist = list(values)
    else:
        raise ProtocolError(
            f"cannot store a {type(values).__name__} as a non-tensor column; pass a numpy array, a list or a pyarrow array"
        )
    return _from_python(pylist)


def _from_python(pylist: list[Any]) -> Column:
    try:
        array = pa.array(pylist)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return _object_array(pylist)
    if _contains_struct(array.type) or pa.types.is_floating(array.type):
        # Arrow fills missing record keys with None and widens ints mixed with floats; keep such columns
        # only if they survive the round trip unchanged, otherwise fall back to Python objects.
        try:
            same = array.to_pylist() == pylist and _same_scalar_types(array, pylist)
        except (ValueError, TypeError):
            same = False
        if not same:
            return _object_array(pylist)
    return pa.chunked_array([array], type=array.type)


def _same_scalar_types(array: pa.Array, pylist: list[Any]) -> bool:
    if not pa.types.is_floating(array.type):
        return True
    return all(value is None or isinstance(value, float) for value in pylist)


def column_length(column: Column) -> int:
    return len(column)


def column_to_numpy(column: Column) -> np.ndarray:
    """A numpy view of a column: zero-copy where Arrow allows, an object array for strings and nested values."""
    if isinstance(column, np.ndarray):
        return column
    type_ = column.type
    numeric = pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
    array: np.ndarray
    if (numeric and column.null_count == 0) or pa.types.is_string(type_) or pa.types.is_large_string(type_):
        array = column.to_numpy()
    else:
        array = _object_array(column.to_pylist())
    return array


def slice_column(column: Column, start: int, stop: int) -> Column:
    if isinstance(column, np.ndarray):
        return column[start:stop]
    return column.slice(start, stop - start)


def take_column(column: Column, indices: np.ndarray) -> Column:
    if isinstance(column, np.ndarray):
        return column[indices]
    return column.take(pa.array(indices, type=pa.int64()))


def concat_columns(key: str, parts: Sequence[Column]) -> Column:
    """Concatenate one column across parts: zero-copy chunk chaining for Arrow, ``np.concatenate`` otherwise."""
    if all(isinstance(p, pa.ChunkedArray) for p in parts):
        arrow: list[Any] = list(parts)  # pa.ChunkedArray (pyarrow has no type information)
        types = {p.type for p in arrow if p.type != pa.null()}
        if len(types) <= 1:
            target = types.pop() if types else pa.null()
            chunks = [c if c.type == target else c.cast(target) for p in arrow for c in p.chunks]
            return pa.chunked_array(chunks, type=target)
        try:
            unified = pa.unify_schemas([pa.schema([(key, t)]) for t in types], promote_options="permissive")
            target = unified.field(key).type
            return pa.chunked_array([c.cast(target) for p in arrow for c in p.chunks], type=target)
        except (pa.ArrowException, TypeError):
            return _object_array([v for p in arrow for v in p.to_pylist()])
    if all(isinstance(p, np.ndarray) and p.dtype != object for p in parts):
        shapes = {p.shape[1:] for p in parts}
        if len(shapes) == 1:
            return np.concatenate(parts)
    return _object_array([v for p in parts for v in (column_to_numpy(p) if isinstance(p, pa.ChunkedArray) else p)])


def compact_column(column: Column) -> Column:
    """Drop bytes a sliced Arrow column still references, so pickling ships only its own rows."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    own = column.nbytes
    total = sum(chunk.get_total_buffer_size() for chunk in column.chunks)
    if total <= own + 4096 and column.num_chunks <= 8:
        return column
    if len(column) == 0:
        return pa.chunked_array([], type=column.type)
    return pa.chunked_array([pa.concat_arrays(column.chunks)], type=column.type)


def columns_equal(a: Column, b: Column) -> bool:
    if isinstance(a, pa.ChunkedArray) and isinstance(b, pa.ChunkedArray):
        return bool(a.type == b.type and a.equals(b))
    left, right = column_to_numpy(a), column_to_numpy(b)
    if left.shape != right.shape:
        return False
    if left.dtype != object and right.dtype != object:
        return bool(np.array_equal(left, right, equal_nan=left.dtype.kind == "f"))
    try:
        return all(_values_equal(x, y) for x, y in zip(left, right))
    except (ValueError, TypeError):
        return False


def _values_equal(x: Any, y: Any) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return bool(np.array_equal(np.asarray(x), np.asarray(y)))
    return bool(x == y)


class NonTensorBatch(MutableMapping[str, np.ndarray]):
    """The non-tensor part of a DataProto: named columns that share one length.

    Behaves like ``dict[str, np.ndarray]``. The Arrow form of a column is reachable through :meth:`arrow` and the
    Arrow-backed columns together through :meth:`table`, for fast paths that want to avoid numpy conversion.
    """

    __slots__ = ("_cache", "_columns", "_length")

    def __init__(self, columns: Mapping[str, Any] | None = None, length: int | None = None) -> None:
        self._columns: dict[str, Column] = {}
        self._cache: dict[str, np.ndarray] = {}
        self._length = length
        for key, values in (columns or {}).items():
            self[key] = values

    @classmethod
    def _from_columns(cls, columns: dict[str, Column], length: int) -> NonTensorBatch:
        out = cls.__new__(cls)
        out._columns = columns
        out._cache = {}
        out._length = length
        return out

    # --- mapping protocol -------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> np.ndarray:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        column = self._columns[key]
        array = column_to_numpy(column)
        if array is column:
            # Share storage but never let a caller write into our own numeric column by accident.
            array = array.view()
        array.flags.writeable = False
        self._cache[key] = array
        return array

    def __setitem__(self, key: str, values: Any) -> None:
        if not isinstance(key, str):
            raise ProtocolError(f"non-tensor column names must be str, got {key!r}")
        column = to_column(values)
        n = column_length(column)
        if self._length is None:
            self._length = n
        elif n != self._length:
            raise ProtocolError(
                f"non-tensor column {key!r} has {n} rows but the batch has {self._length}; every column must have one "
                f"value per row"
            )
        self._columns[key] = column
        self._cache.pop(key, None)

    def __delitem__(self, key: str) -> None:
        del self._columns[key]
        self._cache.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def __contains__(self, key: object) -> bool:
        return key in self._columns

    def __repr__(self) -> str:
        kinds = {k: _describe(c) for k, c in self._columns.items()}
        return f"NonTensorBatch(rows={self._length}, columns={kinds})"

    # --- roll extensions ----------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int | None:
        return self._length

    def column(self, key: str) -> Column:
        """The stored form of a column (Arrow ChunkedArray or numpy array), without conversion."""
        return self._columns[key]

    def arrow(self, key: str) -> pa.ChunkedArray:
        """The column as Arrow. Numeric numpy columns are wrapped zero-copy where Arrow allows."""
        column = self._columns[key]
        if isinstance(column, pa.ChunkedArray):
            return column
        if column.dtype == object:
            return pa.chunked_array([pa.array(list(column))])
        if column.ndim == 1:
            return pa.chunked_array([pa.array(column)])
        raise ProtocolError(f"column {key!r} is a {column.ndim}-D numpy array and has no Arrow form")

    def table(self) -> pa.Table:
        """The Arrow-backed columns as one ``pa.Table`` (numpy-backed columns are not included)."""
        arrow = {k: c for k, c in self._columns.items() if isinstance(c, pa.ChunkedArray)}
        return pa.table(arrow) if arrow else pa.table({})

    def storage_kind(self, key: str) -> str:
        """``"arrow"``, ``"numpy"`` or ``"object"``: how a column is stored (useful in tests and debugging)."""
        return _describe(self._columns[key])

    def _map(self, fn: Callable[[Column], Column], length: int) -> NonTensorBatch:
        return NonTensorBatch._from_columns({k: fn(c) for k, c in self._columns.items()}, length)

    def _slice(self, start: int, stop: int) -> NonTensorBatch:
        return self._map(lambda c: slice_column(c, start, stop), max(0, stop - start))

    def _take(self, indices: np.ndarray) -> NonTensorBatch:
        return self._map(lambda c: take_column(c, indices), len(indices))

    def _select(self, keys: Iterable[str]) -> NonTensorBatch:
        return NonTensorBatch._from_columns({k: self._columns[k] for k in keys}, self._length or 0)


def _describe(column: Column) -> str:
    if isinstance(column, pa.ChunkedArray):
        return "arrow"
    return "object" if column.dtype == object else "numpy"
