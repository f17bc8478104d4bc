"""Weight sync from a training role to inference roles, in size-bounded buckets.

Transport: a standalone torch.distributed process group (gloo on CPU, NCCL on GPU) between the training
leader (rank 0 of the group) and every inference worker, so weights go out once and all engines receive them
together. Each bucket is one flat byte tensor plus a small header (names, dtypes, shapes, offsets). If the
group cannot be formed, the same buckets travel through Ray's object store instead.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["BucketEntry", "WeightChannel", "iter_buckets", "pack_bucket", "unpack_bucket"]


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


class WeightChannel:
    """A process group of its own (not the default one) between a sender (rank 0) and receivers.

    Every member constructs it with the same address, port and world size; construction blocks until all
    members have joined (or ``timeout_s`` passes).
    """

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        world_size: int,
        rank: int,
        *,
        device: torch.device | str = "cpu",
        timeout_s: float = 600.0,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        # Typed loosely: NCCL and Gloo groups share broadcast() at run time but not in torch's stubs.
        self._group: Any = None
        self._store: Any = None
        timeout = timedelta(seconds=timeout_s)
        self._store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
        if self.device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            self._group = dist.ProcessGroupNCCL(self._store, rank, world_size, options)
        else:
            self._group = dist.ProcessGroupGloo(self._store, rank, world_size, timeout)

    def broadcast_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([tensor], options).wait()
        return tensor

    def broadcast_object(self, obj: object = None) -> object:
        """Send ``obj`` from rank 0; every rank returns it."""
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self.broadcast_tensor(size.to(self.device))
        if self.rank != 0:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        received = self.broadcast_tensor(payload.to(self.device)).cpu()
        return obj if self.rank == 0 else pickle.loads(received.numpy().tobytes())

    def send(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> int:
        """Rank 0: broadcast every bucket, then an end marker. Returns bytes sent."""
        sent = 0
        for items in buckets:
            entries, flat = pack_bucket(items, self.device)
            self.broadcast_object(entries)
            self.broadcast_tensor(flat)
            sent += flat.numel()
        self.broadcast_object(None)
        return sent

    def receive(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Receivers: yield each bucket's named tensors until the sender's end marker."""
        while True:
            entries: Any = self.broadcast_object()
            if entries is None:
                return
            total = sum(e.nbytes for e in entries)
            flat = torch.empty(total, dtype=torch.uint8, device=self.device)
            self.broadcast_tensor(flat)
            yield unpack_bucket(entries, flat)

    def close(self) -> None:
        self._group = None
        self._store = None
