from __future__ import annotations

import torch

from roll.strategies.ops import (
    entropy_from_logits,
    language_model_loss,
    log_probs_from_logits,
    position_ids_from_attention_mask,
    response_logits,
    topk_logits,
)


def reference_log_probs(logits, labels, temperature=1.0):
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def test_log_probs_match_log_softmax_with_and_without_grad():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 4
    labels = torch.randint(0, 11, (3, 5))
    for temperature in (1.0, 0.7):
        expected = reference_log_probs(logits, labels, temperature).float()
        torch.testing.assert_close(log_probs_from_logits(logits, labels, temperature), expected, atol=1e-6, rtol=1e-6)
    leaf = logits.clone().requires_grad_()
    out = log_probs_from_logits(leaf, labels)
    out.sum().backward()
    reference = logits.clone().double().requires_grad_()
    reference_log_probs(reference, labels).sum().backward()
    torch.testing.assert_close(leaf.grad.double(), reference.grad, atol=1e-6, rtol=1e-6)


def test_entropy_matches_the_definition_and_chunks_agree(monkeypatch):
    torch.manual_seed(1)
    logits = torch.randn(2, 2100, 7)
    probs = torch.softmax(logits.double(), -1)
    expected = -(probs * probs.log()).sum(-1).float()
    torch.testing.assert_close(entropy_from_logits(logits), expected, atol=1e-5, rtol=1e-5)
    with torch.enable_grad():
        leaf = logits.clone().requires_grad_()
        torch.testing.assert_close(entropy_from_logits(leaf).detach(), expected, atol=1e-5, rtol=1e-5)


def test_language_model_loss_ignores_masked_labels_and_normalizes_by_given_count():
    torch.manual_seed(2)
    logits = torch.randn(2, 4, 9)
    input_ids = torch.randint(0, 9, (2, 4))
    labels = input_ids.clone()
    labels[0, :2] = -100
    loss, count = language_model_loss(logits, labels)
    # Position t predicts label t+1; the valid targets are labels[0,2], labels[0,3], labels[1,1..3].
    terms = [reference_log_probs(logits[0, t], labels[0, t + 1]) for t in (1, 2)]
    terms += [reference_log_probs(logits[1, t], labels[1, t + 1]) for t in (0, 1, 2)]
    expected = -torch.stack(terms).sum() / 5
    assert count.item() == 5
    torch.testing.assert_close(loss.double(), expected, atol=1e-6, rtol=1e-6)
    half, _ = language_model_loss(logits, labels, num_tokens=10)
    torch.testing.assert_close(half * 2, loss)


def test_small_helpers():
    logits = torch.tensor([[[1.0, 3.0, 2.0]]])
    values, indices = topk_logits(logits, 2)
    assert values.tolist() == [[[3.0, 2.0]]] and indices.tolist() == [[[1, 2]]]
    assert response_logits(torch.arange(6.0).reshape(1, 6, 1), 2).flatten().tolist() == [3.0, 4.0]
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_attention_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]
