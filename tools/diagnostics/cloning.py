"""Pieces the behaviour-cloning diagnostics share: a fresh tiny model, the masked loss of a padded batch, one update."""

from __future__ import annotations

import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll.strategies.testing import make_tiny_causal_lm


def tiny_model(preset: str, seed: int):
    """(tokenizer, model) of ``tiny://<preset>?seed=<seed>`` in float32, built in a temporary folder."""
    with tempfile.TemporaryDirectory() as folder:
        path = make_tiny_causal_lm(folder, preset=preset, seed=seed)
        return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def batch_loss(model, pad_id: int, rows: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """Mean next-token loss over the tokens whose mask is 1, rows right-padded with ``pad_id``."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
        attention[i, : len(ids)] = 1
    return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss


def update(model, optimizer: torch.optim.Optimizer, pad_id: int, rows: list[tuple[list[int], list[int]]]) -> float:
    """One AdamW step on ``rows`` (gradient clipped at 1.0); returns the loss before it."""
    model.train()
    loss = batch_loss(model, pad_id, rows)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()
