"""Moving the teacher's top-k distributions to the student without a round trip through the driver.

Each teacher rank keeps only the positions the student trains on (the target mask), packs them into flat arrays
(``indices`` (N, k) in the narrowest integer type the vocabulary allows, ``log_probs`` (N, k) float32, and
``row_offsets`` (rows + 1)) and puts them in its node's Ray object store. The driver receives only a
:class:`TeacherLogits` of small handles (ObjectRefs, row and token counts) and passes it to the student's call;
each student rank fetches just the shards that overlap its rows, straight from the teacher's object store
(zero-copy on the same node), and unpacks them into dense tensors aligned with its logits.

Positions: entry ``[b, t]`` of the dense tensors is the teacher's distribution over the token at ``t + 1``, i.e.
it lines up with the student's logits at position ``t``; ``target_mask(batch)`` (B, T - 1) says which are set.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError

__all__ = ["TeacherLogits", "TopKShard", "index_dtype", "pack_topk", "put_topk", "target_mask", "unpack_topk"]


def target_mask(batch: DataProto, on_prompt: bool = False) -> torch.Tensor:
    """(B, T - 1) bool: the positions whose next token is distilled (response targets; every real next token
    when ``on_prompt``)."""
    data = batch.batch
    if on_prompt:
        mask = data["attention_mask"][:, 1:].bool() & data["attention_mask"][:, :-1].bool()
        if "segment_ids" in data.keys():  # packed rows: never across two examples
            mask &= data["segment_ids"][:, 1:] == data["segment_ids"][:, :-1]
        return mask
    return data["loss_mask"][:, 1:].bool()


def index_dtype(vocab_size: int) -> np.dtype[Any]:
    """The narrowest integer type for token ids below ``vocab_size`` (uint16 up to 65536 ids)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


@dataclass(frozen=True)
class TopKShard:
    """One teacher rank's part: ``rows`` consecutive batch rows, ``tokens`` distilled positions, in ``ref``."""

    ref: Any  # ray.ObjectRef of the dict made by pack_topk
    rows: int
    tokens: int
    nbytes: int


@dataclass(frozen=True)
class TeacherLogits:
    """Handles to a whole batch's teacher top-k, in row order; passed as is to every student rank."""

    shards: tuple[TopKShard, ...]
    k: int  # 0: the whole vocabulary (no indices)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def fetch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Packed arrays for batch rows ``[start, stop)``: fetched from the shards that overlap them only."""
        wanted: list[tuple[TopKShard, int]] = []  # (shard, its first row)
        begin = 0
        for shard in self.shards:
            if begin < stop and begin + shard.rows > start:
                wanted.append((shard, begin))
            begin += shard.rows
        payloads = ray.get([shard.ref for shard, _ in wanted]) if wanted else []
        parts: list[dict[str, np.ndarray]] = []
        for (shard, begin), payload in zip(wanted, payloads):
            lo, hi = max(start, begin) - begin, min(stop, begin + shard.rows) - begin
            offsets = payload["row_offsets"]
            parts.append(
                {
                    "row_offsets": offsets[lo : hi + 1] - offsets[lo],
                    **{k: payload[k][offsets[lo] : offsets[hi]] for k in ("indices", "log_probs") if k in payload},
                }
            )
        return _concat(parts)


def _concat(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    offsets = [np.zeros(1, dtype=np.int64)]
    total = 0
    for part in parts:
        offsets.append(part["row_offsets"][1:] + total)
        total += int(part["row_offsets"][-1])
    out = {"row_offsets": np.concatenate(offsets)}
    for key in ("indices", "log_probs"):
        if key in parts[0]:
            out[key] = np.concatenate([p[key] for p in parts])
    return out


def pack_topk(
    log_probs: torch.Tensor, indices: torch.Tensor | None, mask: torch.Tensor, vocab_size: int
) -> dict[str, np.ndarray]:
    """Dense (B, T - 1, k) teacher top-k -> flat arrays of the ``mask``ed positions (row-major) and row offsets."""
    keep = mask.bool()
    counts = keep.sum(-1).cpu().numpy().astype(np.int64)
    out = {
        "row_offsets": np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)]),
        "log_probs": log_probs[keep].float().cpu().numpy(),
    }
    if indices is not None:
        out["indices"] = indices[keep].cpu().numpy().astype(index_dtype(vocab_size))
    return out


def put_topk(packed: dict[str, np.ndarray], rows: int) -> TopKShard:
    """Put a packed shard in this process's object store; the handle to return to the driver."""
    nbytes = sum(a.nbytes for a in packed.values())
    return TopKShard(ray.put(packed), rows=rows, tokens=int(packed["row_offsets"][-1]), nbytes=nbytes)


def _tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # object-store arrays are read-only; they are copied right away
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def unpack_topk(packed: dict[str, np.ndarray], mask: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Flat arrays -> dense ``teacher_log_probs`` (B, T - 1, k) and ``teacher_ids`` (int64; absent for the whole
    vocabulary) aligned with ``mask``; entries outside the mask are 0 and unused."""
    keep = mask.bool()
    counts = torch.from_numpy(np.diff(packed["row_offsets"]))
    if not torch.equal(counts, keep.sum(-1).cpu()):
        raise ConfigError(
            "the teacher's top-k does not match the student's batch (distilled tokens per row differ): both roles "
            "must see the same rows, tokenizer and distill_on_prompt setting"
        )
    width = packed["log_probs"].shape[-1] if len(packed["log_probs"]) else max(k, 1)
    log_probs = torch.zeros((*keep.shape, width), dtype=torch.float32)
    log_probs[keep] = _tensor(packed["log_probs"]).reshape(-1, width)
    out = {"teacher_log_probs": log_probs}
    if "indices" in packed:
        ids = torch.zeros((*keep.shape, width), dtype=torch.int64)
        ids[keep] = _tensor(packed["indices"].astype(np.int64)).reshape(-1, width)
        out["teacher_ids"] = ids
    return out
