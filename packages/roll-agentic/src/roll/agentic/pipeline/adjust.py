"""Make a step's batch a size the training roles can split: ROLL's ``batch_adjust_mode`` (copy, delete, auto,
random_sample).

Step-wise (and filtered) rollouts yield a varying number of rows. ``copy`` repeats the first rows up to the next
multiple of actor_train's data-parallel size, ``delete`` drops the last rows down to one, ``auto`` picks copy when
at least half the batch would go (ROLL's rule), else delete. ``random_sample`` is ROLL's: when the rows are not
a multiple of the *batch unit* (:func:`batch_unit`: actor_train's rows per optimizer step across its ranks, and
the forward batches of the roles that score the batch), it keeps exactly **one unit** of rows drawn at random
without replacement, in their original order; with fewer rows than a unit it duplicates random rows up to one
unit. Draws are seeded (``seed``), so a run is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from roll.protocol import DataProto
from roll.runtime import ConfigError

__all__ = ["adjust_batch", "batch_unit"]


def batch_unit(train_rows: int, infer_rows: Iterable[int]) -> int:
    """ROLL's ``size_divide``: the least common multiple of actor_train's rows per optimizer step over all its
    ranks (per_device_train_batch_size x gradient_accumulation_steps x dp) and each scoring role's forward rows
    over its ranks (infer_batch_size x dp)."""
    return math.lcm(train_rows, *infer_rows)


def _duplicate(batch: DataProto, rows: int, rng: np.random.Generator) -> DataProto:
    """``batch`` plus ``rows`` randomly drawn copies of its rows (with replacement only when it must)."""
    picks = rng.choice(len(batch), rows, replace=rows > len(batch))
    return DataProto.concat([batch, batch.select_idxs(np.sort(picks))])


def adjust_batch(batch: DataProto, divisor: int, mode: str, *, unit: int | None = None, seed: int = 0) -> DataProto:
    """``batch`` with a multiple of ``divisor`` rows (``random_sample``: of ``unit``, which ``divisor`` divides).

    ``copy`` repeats the first rows, ``delete`` drops the last ones (copy when that would leave none), ``auto``
    copies when the surplus is at least half the batch, ``none`` requires the batch to fit, ``random_sample``
    keeps one random ``unit`` of rows (see the module docstring).
    """
    if mode == "random_sample":
        return _random_sample(batch, divisor, unit or divisor, np.random.default_rng(seed))
    extra = len(batch) % divisor
    if extra == 0:
        return batch
    if mode == "none":
        raise ConfigError(
            f"{len(batch)} samples do not split over {divisor} training ranks; set update.batch_adjust_mode "
            f"to delete, copy, auto or random_sample"
        )
    if mode == "auto":
        mode = "copy" if extra >= 0.5 * len(batch) or len(batch) < divisor else "delete"
    if mode == "delete" and len(batch) > extra:
        return batch.select_idxs(list(range(len(batch) - extra)))
    missing = divisor - extra
    return DataProto.concat([batch, batch.select_idxs([i % len(batch) for i in range(missing)])])


def _random_sample(batch: DataProto, divisor: int, unit: int, rng: np.random.Generator) -> DataProto:
    if unit % divisor:
        raise ConfigError(f"batch unit {unit} is not a multiple of actor_train's {divisor} data-parallel ranks")
    if len(batch) % unit == 0:
        return batch
    if len(batch) < unit:
        return _duplicate(batch, unit - len(batch), rng)
    return batch.select_idxs(np.sort(rng.choice(len(batch), unit, replace=False)))
