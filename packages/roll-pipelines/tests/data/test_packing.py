"""Sequence packing: layout, and logits of each packed example equal to running it alone (tiny Qwen2, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll.pipelines.data import IGNORE_INDEX, DataError, SFTCollator, pack_sft_examples, packed_attention_mask
from roll.strategies.ops import language_model_loss

M = IGNORE_INDEX


def example(length: int, start: int) -> dict[str, list[int]]:
    ids = list(range(start, start + length))
    return {"input_ids": ids, "labels": [M, *ids[1:]]}


def test_first_fit_decreasing_layout() -> None:
    examples = [example(3, 10), example(6, 20), example(2, 30), example(4, 40), example(5, 50)]
    rows = pack_sft_examples(examples, max_length=8)
    # Longest first: 6 -> row 0; 5 -> row 1; 4 -> row 2; 3 -> row 1 (5+3); 2 -> row 0 (6+2).
    assert [row["example_indices"] for row in rows] == [[1, 2], [4, 0], [3]]
    assert rows[0]["input_ids"] == examples[1]["input_ids"] + examples[2]["input_ids"]
    assert rows[0]["position_ids"] == [0, 1, 2, 3, 4, 5, 0, 1]
    assert rows[0]["segment_ids"] == [1] * 6 + [2] * 2
    assert rows[1]["labels"] == [M, 51, 52, 53, 54, M, 11, 12]  # every segment starts with -100
    assert sorted(i for row in rows for i in row["example_indices"]) == list(range(5))
    with pytest.raises(DataError, match=r"example 1 has 6 tokens, more than max_length=5"):
        pack_sft_examples(examples, max_length=5)


def test_packed_attention_mask_is_block_diagonal_causal() -> None:
    mask = packed_attention_mask(torch.tensor([[1, 1, 2, 2, 2, 0]]))
    allowed = (mask[0, 0] == 0).int().tolist()
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.float32
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding attends only itself: no empty softmax row
    ]
    assert mask[0, 0, 0, 1] == torch.finfo(torch.float32).min


def test_collator_pack_mode_tensors() -> None:
    examples = [example(3, 10), example(6, 20), example(2, 30), example(4, 40)]
    batch = SFTCollator(pad_token_id=0, max_length=8, pack=True)(examples)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["segment_ids"].tolist() == [[1] * 6 + [2] * 2, [1] * 4 + [2] * 3 + [0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 1], [0, 1, 2, 3, 0, 1, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 8, [1] * 7 + [0]]
    assert batch.meta_info["num_target_tokens"] == sum(len(e["input_ids"]) - 1 for e in examples)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_each_example_alone(tiny_model_path: Path, attn: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation=attn, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    examples = []
    for length in (9, 5, 7, 3, 6):
        ids = torch.randint(4, 500, (length,), generator=gen).tolist()
        examples.append({"input_ids": ids, "labels": [M, M, *ids[2:]]})
    batch = SFTCollator(pad_token_id=3, max_length=16, pack=True)(examples)
    assert len(batch) < len(examples)
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"],
            attention_mask=packed_attention_mask(batch["segment_ids"], torch.float32),
            position_ids=batch["position_ids"],
        ).logits
        alone = [model(input_ids=torch.tensor([e["input_ids"]])).logits[0] for e in examples]
        packed_loss, packed_count = language_model_loss(packed, batch["labels"], num_tokens=1)
        separate = [
            language_model_loss(a[None], torch.tensor([e["labels"]]), num_tokens=1) for a, e in zip(alone, examples)
        ]
    seen = set()
    for row, segments in enumerate(batch["segment_ids"].tolist()):
        for segment in sorted(set(segments) - {0}):
            cols = [t for t, s in enumerate(segments) if s == segment]
            # The examples were packed longest-first; find which one this segment is by its tokens.
            tokens = batch["input_ids"][row, cols].tolist()
            index = next(i for i, e in enumerate(examples) if e["input_ids"] == tokens and i not in seen)
            seen.add(index)
            assert (packed[row, cols] - alone[index]).abs().max().item() <= 1e-5
    assert seen == set(range(len(examples)))
    # Segment-start labels are -100, so no loss term predicts across examples: summed losses agree.
    assert int(packed_count) == sum(int(c) for _, c in separate)
    assert torch.allclose(packed_loss, sum(loss for loss, _ in separate), atol=1e-4)


def test_position_ids_alone_also_separate_segments(tiny_model_path: Path) -> None:
    """Without a mask and with use_cache=False, transformers derives the packing from position_ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_path, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    examples = [example(5, 100), example(4, 200)]
    rows = pack_sft_examples(examples, max_length=16)
    with torch.no_grad():
        packed = model(
            input_ids=torch.tensor([rows[0]["input_ids"]]),
            position_ids=torch.tensor([rows[0]["position_ids"]]),
            use_cache=False,
        ).logits[0]
        for start, e in zip((0, 5), examples):
            alone = model(input_ids=torch.tensor([e["input_ids"]])).logits[0]
            assert (packed[start : start + len(e["input_ids"])] - alone).abs().max().item() <= 1e-5
