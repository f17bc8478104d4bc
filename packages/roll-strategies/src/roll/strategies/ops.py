"""Model-output maths shared by every backend, written to hold vocabulary-sized tensors as briefly as possible.

``log_probs_from_logits`` uses ``gather - logsumexp``: autograd then saves only the logits (which already
exist) and a per-position scalar, not a second (positions x vocab) log-softmax. Inference-only helpers work in
row chunks so their temporary (chunk x vocab) buffers stay small.
"""

from __future__ import annotations

import inspect

import torch

__all__ = [
    "accepts_logits_to_keep",
    "entropy_from_logits",
    "language_model_loss",
    "log_probs_from_logits",
    "packed_attention_mask",
    "position_ids_from_attention_mask",
    "response_logits",
    "topk_logits",
]

_CHUNK_ROWS = 1024


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(label) under softmax(logits / temperature); shapes (..., V) and (...) -> (...), float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    if not torch.is_grad_enabled() or not logits.requires_grad:
        return picked - _chunked_logsumexp(logits)
    return picked - torch.logsumexp(logits, dim=-1)


def _chunked_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, flat.shape[0], _CHUNK_ROWS):
        out[start : start + _CHUNK_ROWS] = torch.logsumexp(flat[start : start + _CHUNK_ROWS].float(), dim=-1)
    return out.reshape(logits.shape[:-1])


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: (..., V) -> (...), float32."""
    if torch.is_grad_enabled() and logits.requires_grad:
        scaled = logits.float() / temperature
        probs = torch.softmax(scaled, dim=-1)
        return torch.logsumexp(scaled, dim=-1) - (probs * scaled).sum(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, flat.shape[0], _CHUNK_ROWS):
        chunk = flat[start : start + _CHUNK_ROWS].float() / temperature
        out[start : start + _CHUNK_ROWS] = torch.logsumexp(chunk, -1) - (torch.softmax(chunk, -1) * chunk).sum(-1)
    return out.reshape(logits.shape[:-1])


def language_model_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    num_tokens: int | torch.Tensor | None = None,
    shifted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy divided by ``num_tokens`` (default: this batch's valid tokens).

    ``labels`` are aligned with ``input_ids`` unless ``shifted`` (position t predicts label t+1). Returns
    ``(loss, valid_tokens_in_this_batch)``; pass the global token count to get an exact share of a larger batch.
    """
    if not shifted:
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    valid = labels != ignore_index
    safe_labels = torch.where(valid, labels, torch.zeros_like(labels))
    token_log_probs = log_probs_from_logits(logits, safe_labels)
    total = -(token_log_probs * valid).sum()
    count = valid.sum()
    denominator = count.clamp(min=1) if num_tokens is None else num_tokens
    return total / denominator, count


def topk_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logits per position and their token ids: (..., V) -> ((..., k), (..., k))."""
    values, indices = torch.topk(logits, k, dim=-1)
    return values, indices


def response_logits(logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """The logits that predict the last ``response_length`` tokens of each row: (B, T, V) -> (B, R, V)."""
    return logits[:, -response_length - 1 : -1, :]


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model(..., logits_to_keep=k)`` computes logits for the last k positions only (transformers'
    causal LMs do; custom heads may not)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token (padding positions get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def packed_attention_mask(segment_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A (B, 1, T, T) additive mask for packed rows: 0 where query t may attend key s, the dtype's minimum elsewhere.

    Token t attends s iff s <= t and both belong to the same segment (``segment_ids`` > 0, 0 = padding).
    Padding tokens attend only themselves, so no attention row is empty (an empty row gives NaN). Use the
    model's compute dtype: eager attention adds the mask to the scores, so a boolean mask would be wrong there.
    """
    if segment_ids.dim() != 2:
        raise ValueError(f"segment_ids must be (batch, length), got shape {tuple(segment_ids.shape)}")
    length = segment_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids != 0)[:, :, None]
    diagonal = torch.eye(length, dtype=torch.bool, device=segment_ids.device)
    allowed = (causal & same & real) | diagonal
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=segment_ids.device)
    zero = torch.zeros((), dtype=dtype, device=segment_ids.device)
    return torch.where(allowed, zero, blocked)[:, None]
