"""A resumable, endless batch-index iterator: deterministic epochs that a checkpoint can continue exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from roll.pipelines.data.errors import DataError
from roll.runtime.errors import ConfigError

__all__ = ["StatefulBatchIterator"]

_STATE_VERSION = 1


class StatefulBatchIterator:
    """Yields lists of row indices, epoch after epoch, forever.

    Epoch ``e``'s order is a permutation drawn from ``(seed, e)`` alone (identity order without ``shuffle``), so
    any epoch can be rebuilt without replaying earlier ones. A batch never spans two epochs: with ``drop_last``
    the last ``num_rows % batch_size`` rows of each (shuffled) epoch are skipped, otherwise the epoch ends with a
    smaller batch. ``state_dict()`` records the position; ``load_state_dict()`` on an iterator built with the same
    arguments continues with exactly the batches the saved one would have produced.
    """

    def __init__(
        self, num_rows: int, batch_size: int, *, seed: int, shuffle: bool = True, drop_last: bool = True
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if num_rows < 1:
            raise DataError("the dataset has no rows, so no batch can be drawn; check the data files and filters")
        if drop_last and batch_size > num_rows:
            raise DataError(
                f"batch_size={batch_size} is larger than the dataset ({num_rows} rows) and drop_last is set, so no "
                f"batch would ever be produced; lower the batch size, add data, or set drop_last=False"
            )
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0  # index into the current epoch's order of the next batch's first row
        self._order = self._epoch_order(0)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_rows)
        # SeedSequence mixes (seed, epoch) into independent streams, stable across numpy versions and platforms.
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        return rng.permutation(self.num_rows)

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        stop = min(self._position + self.batch_size, self.num_rows)
        batch = self._order[self._position : stop].tolist()
        self._position = stop
        remaining = self.num_rows - self._position
        if remaining == 0 or (self.drop_last and remaining < self.batch_size):
            self._epoch += 1
            self._position = 0
            self._order = self._epoch_order(self._epoch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator is, plus the arguments it was built with (checked on load)."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "position": self._position,
            "num_rows": self.num_rows,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; it must come from an iterator built with the same arguments."""
        if state.get("version") != _STATE_VERSION:
            raise DataError(f"batch iterator state has version {state.get('version')!r}, expected {_STATE_VERSION}")
        for name in ("num_rows", "batch_size", "seed", "shuffle", "drop_last"):
            if state.get(name) != getattr(self, name):
                raise DataError(
                    f"the checkpoint's batch iterator had {name}={state.get(name)!r} but this one has "
                    f"{name}={getattr(self, name)!r}; resume with the same data, batch size and seed, or start fresh"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_rows:
            raise DataError(f"batch iterator state is corrupt: epoch={epoch}, position={position}")
        self._epoch, self._position = epoch, position
        self._order = self._epoch_order(epoch)
