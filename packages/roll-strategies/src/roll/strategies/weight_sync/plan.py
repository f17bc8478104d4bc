"""The sync plan: which tensors travel in which bucket, at which byte offset of a bucket slot.

A plan is computed once per channel from the trainer's tensor list (names, dtypes, full shapes) and reused by
every sync: senders and receivers derive the same per-bucket views of a slot from it, so a bucket travels with
no header and nothing is computed per parameter while weights move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["ALIGN", "BucketPlan", "SyncPlan", "TensorSpec", "bucket_views", "build_plan", "slot_views", "specs_of"]

# Every tensor starts at a multiple of this many bytes of its slot: any dtype can view it and copies stay aligned.
ALIGN = 64


@dataclass(frozen=True)
class TensorSpec:
    """A full (unsharded) tensor as the inference side receives it: HF name, dtype, shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class BucketPlan:
    """Tensors ``start:stop`` of the plan, laid out in the first ``nbytes`` bytes of a slot."""

    index: int
    start: int
    stop: int
    nbytes: int
    payload: int  # the tensors' own bytes (nbytes minus alignment padding)


@dataclass(frozen=True)
class SyncPlan:
    tensors: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]  # byte offset of each tensor inside its bucket's slot
    buckets: tuple[BucketPlan, ...]
    slot_bytes: int  # the largest bucket: every slot has this size

    @property
    def payload(self) -> int:
        """Bytes of weights one sync moves."""
        return sum(bucket.payload for bucket in self.buckets)

    @property
    def fingerprint(self) -> str:
        """Identifies the layout: a sender and a receiver with the same fingerprint agree on every byte."""
        digest = hashlib.sha1()
        for spec, offset in zip(self.tensors, self.offsets):
            digest.update(f"{spec.name}|{spec.dtype}|{spec.shape}|{offset};".encode())
        return digest.hexdigest()[:16]

    def describe(self) -> str:
        return (
            f"{len(self.tensors)} tensors, {self.payload} bytes in {len(self.buckets)} buckets of <= {self.slot_bytes}"
        )


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def build_plan(specs: Iterable[TensorSpec], bucket_bytes: int) -> SyncPlan:
    """Greedy buckets of at most ``bucket_bytes`` in the given order (a larger tensor gets a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    tensors = tuple(specs)
    offsets: list[int] = []
    buckets: list[BucketPlan] = []
    start, used, payload = 0, 0, 0
    for index, spec in enumerate(tensors):
        offset = _aligned(used)
        if index > start and offset + spec.nbytes > bucket_bytes:
            buckets.append(BucketPlan(len(buckets), start, index, used, payload))
            start, offset, payload = index, 0, 0
        offsets.append(offset)
        used = offset + spec.nbytes
        payload += spec.nbytes
    if tensors:
        buckets.append(BucketPlan(len(buckets), start, len(tensors), used, payload))
    slot_bytes = max((bucket.nbytes for bucket in buckets), default=0)
    return SyncPlan(tensors, tuple(offsets), tuple(buckets), _aligned(max(slot_bytes, 1)))


def slot_views(plan: SyncPlan, slot: torch.Tensor) -> list[list[tuple[str, torch.Tensor]]]:
    """For every bucket, its tensors as (name, view into ``slot``) with their dtype and full shape.

    ``slot`` is a flat uint8 tensor of at least ``plan.slot_bytes`` bytes (host or device memory).
    """
    if slot.dtype != torch.uint8 or slot.dim() != 1 or slot.numel() < plan.slot_bytes:
        raise ValueError(f"a slot must be a flat uint8 tensor of >= {plan.slot_bytes} bytes, got {tuple(slot.shape)}")
    return [bucket_views(plan, bucket, slot) for bucket in plan.buckets]


def specs_of(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [TensorSpec(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in named_tensors]


def bucket_views(plan: SyncPlan, bucket: BucketPlan, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """One bucket's tensors as views into ``flat`` (a uint8 tensor of at least ``bucket.nbytes`` bytes)."""
    out = []
    for index in range(bucket.start, bucket.stop):
        spec, offset = plan.tensors[index], plan.offsets[index]
        out.append((spec.name, flat[offset : offset + spec.nbytes].view(spec.dtype).view(spec.shape)))
    return out
