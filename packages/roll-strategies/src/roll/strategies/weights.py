"""Size-bounded buckets of named tensors, packed into one flat byte tensor each.

Helpers for code that moves weights without a channel (tests, one-off pushes into a strategy). Weight sync between
roles (shared memory, broadcast, object store) lives in :mod:`roll.strategies.weight_sync`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

__all__ = ["BucketEntry", "iter_buckets", "pack_bucket", "unpack_bucket"]


@dataclass(frozen=True)
class BucketEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors into buckets of at most ``bucket_bytes`` (a larger tensor gets a bucket of its own)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def pack_bucket(
    items: list[tuple[str, torch.Tensor]], device: torch.device | str = "cpu"
) -> tuple[list[BucketEntry], torch.Tensor]:
    """One flat uint8 tensor holding every tensor of the bucket, and the header to unpack it."""
    entries, offset = [], 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(BucketEntry(name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
        offset += nbytes
    flat = torch.empty(offset, dtype=torch.uint8, device=device)
    for entry, (_, tensor) in zip(entries, items):
        if entry.nbytes:
            flat[entry.offset : entry.offset + entry.nbytes].copy_(
                tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            )
    return entries, flat


def unpack_bucket(entries: list[BucketEntry], flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views into ``flat`` with the original names, dtypes and shapes (no copies)."""
    out = []
    for entry in entries:
        raw = flat[entry.offset : entry.offset + entry.nbytes]
        out.append((entry.name, raw.view(entry.dtype).reshape(entry.shape)))
    return out
