"""Collators: padding side, label/loss-mask conventions, pair layout and non-tensor carry-through."""

from __future__ import annotations

import pytest
import torch

from roll.pipelines.data import (
    IGNORE_INDEX,
    DataArgs,
    DataError,
    PreferenceCollator,
    PromptCollator,
    SFTCollator,
    encode_prompt,
    encode_sft,
)
from roll.protocol import DataProto
from roll.runtime.errors import ConfigError
from roll.strategies.ops import language_model_loss, log_probs_from_logits

PAD = 0
M = IGNORE_INDEX


def sft_examples() -> list[dict[str, list[int]]]:
    return [
        {"input_ids": [11, 12, 13, 14], "labels": [M, M, 13, 14]},
        {"input_ids": [21, 22], "labels": [M, 22]},
        {"input_ids": [31, 32, 33], "labels": [31, 32, 33]},  # a target on the first token is never trained
    ]


def test_sft_collator_right_pads_and_aligns_labels() -> None:
    batch = SFTCollator(pad_token_id=PAD, max_length=8)(sft_examples())
    assert isinstance(batch, DataProto) and len(batch) == 3
    assert batch["input_ids"].tolist() == [[11, 12, 13, 14], [21, 22, PAD, PAD], [31, 32, 33, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert batch["position_ids"][:, :3].tolist() == [[0, 1, 2], [0, 1, 1], [0, 1, 2]]
    assert batch["labels"].tolist() == [[M, M, 13, 14], [M, 22, M, M], [M, 32, 33, M]]
    assert batch["loss_mask"].dtype == torch.bool
    assert batch["loss_mask"].tolist() == (batch["labels"] != M).tolist()
    assert batch.meta_info == {"num_target_tokens": 5, "num_examples": 3}


def test_loss_mask_marks_targets_consistently_with_language_model_loss() -> None:
    batch = SFTCollator(pad_token_id=PAD, max_length=8)(sft_examples())
    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(0))
    loss, count = language_model_loss(logits, batch["labels"])
    # loss_mask[:, t] says token t is predicted by the logits at t - 1: slice [:, 1:] for shifted log-probs.
    token_lp = log_probs_from_logits(logits[:, :-1], batch["input_ids"][:, 1:])
    mask = batch["loss_mask"][:, 1:]
    assert int(count) == int(mask.sum()) == 5
    assert torch.allclose(loss, -(token_lp * mask).sum() / mask.sum())
    assert not batch["loss_mask"][:, 0].any()


def test_sft_pad_to_multiple_never_exceeds_max_length() -> None:
    examples = sft_examples()
    assert SFTCollator(PAD, 16, pad_to_multiple_of=8)(examples)["input_ids"].shape == (3, 8)
    assert SFTCollator(PAD, 6, pad_to_multiple_of=8)(examples)["input_ids"].shape == (3, 6)
    with pytest.raises(DataError, match=r"example 0 has 4 tokens, more than the collator's limit of 3"):
        SFTCollator(PAD, 3)(examples)
    with pytest.raises(ConfigError, match=r"pad_to_multiple_of must be a positive"):
        SFTCollator(PAD, 3, pad_to_multiple_of=0)


def test_sft_collator_on_encoded_rows(tokenizer) -> None:
    args = DataArgs(file_name="x.jsonl")
    rows = [{"prompt": "What is 1 + 2?", "response": "3"}, {"prompt": "hi", "response": "The answer is 12."}]
    examples = [encode_sft(r, tokenizer, args) for r in rows]
    batch = SFTCollator(tokenizer.pad_token_id, 128)(examples)
    for i, example in enumerate(examples):
        n = len(example["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == example["input_ids"]
        assert (batch["input_ids"][i, n:] == tokenizer.pad_token_id).all()
        assert tokenizer.decode(batch["input_ids"][i][batch["loss_mask"][i]]) == rows[i]["response"] + "<|im_end|>"


def test_preference_collator_interleaves_pairs() -> None:
    examples = [
        {"prompt_ids": [1, 2], "chosen_ids": [3, 4], "rejected_ids": [5]},
        {"prompt_ids": [6], "chosen_ids": [7], "rejected_ids": [8, 9, 10]},
    ]
    batch = PreferenceCollator(pad_token_id=PAD, max_length=8)(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [1, 2, 5, PAD], [6, 7, PAD, PAD], [6, 8, 9, 10]]
    assert batch["labels"].tolist() == [[M, M, 3, 4], [M, M, 5, M], [M, 7, M, M], [M, 8, 9, 10]]
    assert batch["loss_mask"].tolist() == (batch["labels"] != M).tolist()
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3]
    assert batch["pair_index"].tolist() == [0, 0, 1, 1]
    assert batch["is_chosen"].tolist() == [True, False, True, False]
    assert batch.meta_info["num_target_tokens"] == 7 and batch.meta_info["num_pairs"] == 2
    with pytest.raises(DataError, match=r"pair 1 \(rejected\) has 4 tokens, more than the collator.s limit of 3"):
        PreferenceCollator(PAD, 3)([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}, examples[1]])


def test_prompt_collator_left_pads_and_carries_non_tensors(tokenizer) -> None:
    args = DataArgs(file_name="x.jsonl", extra_keys=["ground_truth"])
    rows = [
        {"prompt": "What is 1 + 2?", "ground_truth": "3", "tag": "math"},
        {"prompt": "What is 10 + 20?", "ground_truth": "30", "tag": "math2"},
    ]
    examples = [encode_prompt(r, tokenizer, args) for r in rows]
    length = 32
    batch = PromptCollator(tokenizer.pad_token_id, prompt_length=length)(examples)
    assert batch["input_ids"].shape == (2, length)
    for i, example in enumerate(examples):
        n = len(example["prompt_ids"])
        assert batch["input_ids"][i, length - n :].tolist() == example["prompt_ids"]
        assert (batch["input_ids"][i, : length - n] == tokenizer.pad_token_id).all()
        assert batch["attention_mask"][i].tolist() == [0] * (length - n) + [1] * n
        assert batch["position_ids"][i, length - n :].tolist() == list(range(n))
    assert batch["prompt"].tolist() == [r["prompt"] for r in rows]
    assert batch["ground_truth"].tolist() == ["3", "30"]
    assert batch["tag"].tolist() == ["math", "math2"]
    uids = batch["uid"].tolist()
    assert len(set(uids)) == 2 and all(isinstance(u, str) and u for u in uids)
    other = PromptCollator(tokenizer.pad_token_id, prompt_length=length)(examples)
    assert not set(other["uid"].tolist()) & set(uids)
    # Non-tensor columns follow row selection.
    assert batch.select_idxs([1])["ground_truth"].tolist() == ["30"]


def test_prompt_collator_pad_to_longest_and_errors() -> None:
    examples = [{"prompt_ids": [1, 2, 3], "tag": "a"}, {"prompt_ids": [4], "tag": "b"}]
    batch = PromptCollator(PAD, prompt_length=8, pad_to_longest=True)(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [PAD, PAD, 4]]
    with pytest.raises(DataError, match=r"prompt 0 has 3 tokens, more than the collator's limit of 2"):
        PromptCollator(PAD, prompt_length=2)(examples)
    with pytest.raises(DataError, match=r"prompt 1 has fields \['prompt_ids'\] but prompt 0 has"):
        PromptCollator(PAD, prompt_length=8)([examples[0], {"prompt_ids": [1]}])
    with pytest.raises(DataError, match=r"empty batch"):
        PromptCollator(PAD, prompt_length=8)([])
