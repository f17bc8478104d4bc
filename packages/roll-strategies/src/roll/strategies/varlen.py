"""Variable-length (packed) attention without flash-attn: ``scaled_dot_product_attention`` once per packed sequence.

transformers runs packed rows (one (1, N) sequence whose positions restart per row) with ``sdpa`` / ``eager`` by
building a dense (N, N) block-diagonal mask: attention then costs N^2 for sum(len^2) of useful work, so packing
many rows into one sequence wastes most of the attention compute. ``flash_attention_2`` avoids that with
``cu_seqlens`` (varlen kernels), which CPUs and many GPUs do not have. This module registers an attention
implementation, :data:`VARLEN_SDPA`, that takes the same ``cu_seq_lens_q`` / ``cu_seq_lens_k`` keyword arguments
(transformers passes them from the model call down to every attention layer) and runs causal SDPA on each
sequence's slice: exact, no mask is built, and the work is sum(len^2). A call that is not packed (a padded batch, as
greedy decoding with a KV cache sends to a model set up for packing) runs transformers' own SDPA with its mask.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from roll.strategies.contract import StrategyError

__all__ = ["VARLEN_SDPA", "register_varlen_sdpa", "varlen_kwargs"]

VARLEN_SDPA = "roll_varlen_sdpa"
_registered = False


def varlen_kwargs(position_ids: torch.Tensor) -> dict[str, Any]:
    """The model-call keywords of packed positions (1, N) that restart at 0 per sequence: cumulative lengths
    (int32, sequences + 1) and the longest sequence, for ``flash_attention_*`` and :data:`VARLEN_SDPA`."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten()
    if not len(starts) or int(starts[0]) != 0:
        raise StrategyError("packed position_ids must start every sequence (the first one included) at 0")
    end = torch.tensor([flat.numel()], dtype=starts.dtype, device=starts.device)
    cu_seqlens = torch.cat([starts, end]).to(torch.int32)
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": longest, "max_length_k": longest}


def _varlen_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """(1, heads, N, dim) query/key/value -> (1, N, heads, dim), each packed sequence attending only to itself."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:  # not packed: the padded batch's own mask (from _mask below)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise StrategyError(
            f"attention implementation {VARLEN_SDPA!r} runs packed rows as one sequence of shape (1, N); this call "
            f"gave cu_seq_lens_q with a batch of {query.shape[0]} rows"
        )
    if sliding_window is not None:
        raise StrategyError(f"{VARLEN_SDPA!r} does not implement sliding-window attention; turn sequence_packing off")
    bounds = cu_seqlens.tolist()
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1],
        )
        for start, end in itertools.pairwise(bounds)
        if end > start
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _mask(batch_size: int, q_length: int, kv_length: int, **kwargs: Any) -> Any:
    """No mask for one whole sequence without padding (packed rows: :func:`_varlen_sdpa` reads their bounds from
    ``cu_seq_lens_q``; one unpadded row: causal as it is); SDPA's mask for anything else (padding, a KV cache)."""
    if kwargs.get("attention_mask") is None and batch_size == 1 and q_length == kv_length:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(batch_size, q_length, kv_length, **kwargs)


def register_varlen_sdpa() -> str:
    """Register :data:`VARLEN_SDPA` with transformers (once per process); returns its name for
    ``model.set_attn_implementation``."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(VARLEN_SDPA, _varlen_sdpa)
        AttentionMaskInterface.register(VARLEN_SDPA, _mask)
        _registered = True
    return VARLEN_SDPA
