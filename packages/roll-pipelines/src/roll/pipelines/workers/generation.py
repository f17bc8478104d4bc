"""Greedy decoding with forward passes only, for roles whose backend does not generate (e.g. ``fsdp2_train``).

It recomputes the whole sequence at every new token (no KV cache), which is fine for the short answers of a
held-out evaluation and lets SFT and DPO measure what their own training model generates, with no inference
engine and no weight sync. Every rank runs the same number of forward passes (``max_new_tokens``), as the
collectives of sharded backends require.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.protocol import DataProto

__all__ = ["greedy_decode", "next_token_forward"]


def next_token_forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """forward_func: the most likely next token after each row (its last position)."""
    return {"next_token": logits[:, -1].argmax(-1)}


def greedy_decode(
    strategy: Any, prompts: DataProto, *, max_new_tokens: int, eos_token_id: int, pad_token_id: int
) -> DataProto:
    """Greedy continuations of left-padded ``prompts`` (``input_ids``, ``attention_mask``).

    Returns ``responses`` (B, max_new_tokens) right-padded with ``pad_token_id`` after the first EOS (which is
    kept) and ``response_mask`` (1 on generated tokens up to and including EOS).
    """
    input_ids = prompts.batch["input_ids"]
    mask = prompts.batch["attention_mask"]
    rows = len(prompts)
    responses = torch.full((rows, max_new_tokens), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, max_new_tokens), dtype=torch.long)
    done = torch.zeros(rows, dtype=torch.bool)
    for t in range(max_new_tokens):
        step = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask})
        out = strategy.forward_step(step, next_token_forward, logits_to_keep=1)
        alive = ~done
        token = out["next_token"].to(torch.long) if rows else torch.zeros(0, dtype=torch.long)
        token = torch.where(alive, token, torch.full_like(token, pad_token_id))
        responses[:, t] = token
        response_mask[:, t] = alive.long()
        done = done | (alive & (token == eos_token_id))
        # Finished rows keep running (every rank must make the same passes) but their new tokens are masked out.
        input_ids = torch.cat([input_ids, token[:, None]], dim=1)
        mask = torch.cat([mask, alive.long()[:, None]], dim=1)
    return DataProto.from_dict({"responses": responses, "response_mask": response_mask})
