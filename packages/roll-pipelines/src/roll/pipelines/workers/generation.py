"""Greedy decoding with forward passes only, for roles whose backend does not generate (e.g. ``fsdp2_train``).

SFT and DPO measure what their own training model generates, with no inference engine and no weight sync. When
the strategy holds a Hugging Face causal LM (``strategy.model``, sharded or not) the answer is decoded with a KV
cache, one new token per pass; otherwise (any other backend) the whole sequence is recomputed through
``forward_step`` at every new token. Either way every rank runs the same number of forward passes
(``max_new_tokens``), as the collectives of sharded backends require.
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
    model = getattr(strategy, "model", None)
    if isinstance(model, torch.nn.Module) and hasattr(model, "can_generate"):
        device = getattr(strategy, "device", torch.device("cpu"))
        return _decode_with_cache(model, device, prompts, max_new_tokens, eos_token_id, pad_token_id)
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


def _decode_with_cache(
    model: Any, device: torch.device, prompts: DataProto, max_new_tokens: int, eos_token_id: int, pad_token_id: int
) -> DataProto:
    """:func:`greedy_decode` on a Hugging Face causal LM with its KV cache: the prompt once, then one token a pass."""
    rows = len(prompts)
    if rows:
        input_ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].long()
    else:  # a rank without rows still runs every pass with the others (sharded models gather in each)
        input_ids, mask = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long)
    responses = torch.full((rows, max_new_tokens), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, max_new_tokens), dtype=torch.long)
    done = torch.zeros(len(input_ids), dtype=torch.bool)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
            )
            last = positions[:, -1]
            for t in range(max_new_tokens):
                alive = ~done
                token = out.logits[:, -1].argmax(-1).cpu()
                token = torch.where(alive, token, torch.full_like(token, pad_token_id))
                if rows:
                    responses[:, t], response_mask[:, t] = token, alive.long()
                done = done | (alive & (token == eos_token_id))
                if t + 1 == max_new_tokens:
                    break
                mask = torch.cat([mask, alive.long()[:, None]], dim=1)
                last = last + 1
                out = model(
                    input_ids=token[:, None].to(device),
                    attention_mask=mask.to(device),
                    position_ids=last[:, None].to(device),
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
    finally:
        model.train(was_training)
    return DataProto.from_dict({"responses": responses, "response_mask": response_mask})
