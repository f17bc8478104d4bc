"""Generation evaluation for SFT/DPO: held-out prompts and answers, answer-only targets, greedy decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from roll.pipelines.data import IGNORE_INDEX, DataArgs, encode_preference, encode_sft
from roll.pipelines.evaluation import (
    HeldOutAnswers,
    answer_items_from_pairs,
    answer_items_from_sft,
    answer_only_examples,
)
from roll.pipelines.workers import greedy_decode
from roll.protocol import DataProto
from roll.runtime import ConfigError

ARGS = DataArgs(file_name="unused.jsonl")


def _sft(tokenizer: Any, prompt: str, response: str) -> dict[str, list[int]]:
    return encode_sft({"prompt": prompt, "response": response}, tokenizer, ARGS)


def test_sft_items_hold_the_generation_prompt_and_the_reference_answer(tokenizer: Any) -> None:
    examples = [
        _sft(tokenizer, "What is 12 + 7?", r"The answer is \boxed{19}."),
        _sft(tokenizer, "Say hi", "hello there"),
        _sft(tokenizer, "What is 3 - 5?", "The answer is -2."),
    ]
    items, skipped = answer_items_from_sft(examples, tokenizer)
    assert skipped == 1  # "hello there" states no answer
    assert [(i.reference, i.ground_truth) for i in items] == [
        (r"The answer is \boxed{19}.", "19"),
        ("The answer is -2.", "-2"),
    ]
    prompt = tokenizer.decode(items[0].prompt_ids)
    assert prompt.endswith("What is 12 + 7?<|im_end|>\n<|im_start|>assistant\n")
    assert answer_items_from_sft(examples, tokenizer, limit=1)[0] == items[:1]


def test_pair_items_take_the_chosen_answer(tokenizer: Any) -> None:
    pair = encode_preference(
        {"prompt": "What is 2 + 2?", "chosen": r"The answer is \boxed{4}.", "rejected": r"The answer is \boxed{5}."},
        tokenizer,
        ARGS,
    )
    items, skipped = answer_items_from_pairs([pair], tokenizer)
    assert skipped == 0 and items[0].ground_truth == "4" and items[0].prompt_ids == pair["prompt_ids"]


@pytest.mark.parametrize(
    ("response", "answer"), [(r"The answer is \boxed{105}.", "105"), ("The answer is -38.", "-38")]
)
def test_answer_only_examples_target_exactly_the_answer_tokens(tokenizer: Any, response: str, answer: str) -> None:
    example = _sft(tokenizer, "What is 1 + 1?", response)
    [only], skipped = answer_only_examples([example], tokenizer)
    assert skipped == 0 and only["input_ids"] == example["input_ids"]
    targets = [token for token in only["labels"] if token != IGNORE_INDEX]
    assert tokenizer.decode(targets).strip() == answer
    # Every answer target is also a target of the full example.
    assert all(full != IGNORE_INDEX for full, part in zip(example["labels"], only["labels"]) if part != IGNORE_INDEX)
    assert answer_only_examples([_sft(tokenizer, "Say hi", "hello")], tokenizer) == ([], 1)


class _CountingStrategy:
    """Predicts (last token + 1) and records the batches it sees, like a forward-only backend would."""

    def __init__(self, eos: int) -> None:
        self.eos = eos
        self.calls: list[DataProto] = []
        self.logits_to_keep: list[int | None] = []

    def forward_step(
        self, batch: DataProto, forward_func: Any, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        self.calls.append(batch)
        self.logits_to_keep.append(logits_to_keep)
        ids = batch.batch["input_ids"]
        vocab = max(int(ids.max()) + 2, self.eos + 1)
        logits = torch.nn.functional.one_hot(ids + 1, vocab).float()
        return forward_func(batch, logits)


def test_greedy_decode_stops_each_row_at_eos_and_pads_after_it() -> None:
    eos, pad = 9, 0
    prompts = DataProto.from_dict(
        {"input_ids": torch.tensor([[0, 5, 6], [3, 4, 7]]), "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}
    )
    strategy = _CountingStrategy(eos)
    out = greedy_decode(strategy, prompts, max_new_tokens=4, eos_token_id=eos, pad_token_id=pad)
    # Row 0 counts 7, 8, 9 (EOS), then pads; row 1 reaches EOS at once after 8.
    assert out.batch["responses"].tolist() == [[7, 8, 9, 0], [8, 9, 0, 0]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert len(strategy.calls) == 4  # a fixed number of passes: every rank of a sharded model runs the same
    assert strategy.logits_to_keep == [1] * 4  # only the last position's logits are needed
    assert strategy.calls[-1].batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]


class _FakeRole:
    """A role whose greedy answer to every prompt is a fixed text."""

    def __init__(self, tokenizer: Any, answers: list[str]) -> None:
        self.tokenizer, self.answers, self.seen = tokenizer, answers, 0

    def generate_greedy(self, batch: DataProto, max_new_tokens: int) -> DataProto:
        texts = self.answers[self.seen : self.seen + len(batch)]
        self.seen += len(batch)
        ids = [self.tokenizer.encode(t + "<|im_end|>", add_special_tokens=False)[:max_new_tokens] for t in texts]
        width = max(map(len, ids))
        responses = torch.tensor([row + [0] * (width - len(row)) for row in ids])
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        return DataProto.from_dict({"responses": responses, "response_mask": mask})


def test_held_out_answers_grade_what_the_role_generates(tokenizer: Any) -> None:
    examples = [_sft(tokenizer, f"What is {a} + 1?", rf"The answer is \boxed{{{a + 1}}}.") for a in range(4)]
    held_out = HeldOutAnswers.build(examples, tokenizer, rows=4, max_new_tokens=16, batch_size=3)
    role = _FakeRole(tokenizer, [r"The answer is \boxed{1}.", "The answer is 2.", r"The answer is \boxed{9}.", "hm"])
    metrics = held_out(role)
    assert metrics == {
        "val/correct": 0.5,
        "val/format": 0.5,
        "val/correct_and_format": 0.25,
        "val/exact_match": 0.25,
        "val/generated": 4.0,
    }
    assert role.seen == 4
    assert HeldOutAnswers.build(examples, tokenizer, rows=0, max_new_tokens=8, batch_size=2)(role) == {}
    with pytest.raises(ConfigError, match="val_generation_rows=2"):
        HeldOutAnswers.build([_sft(tokenizer, "hi", "hello")] * 2, tokenizer, rows=2, max_new_tokens=8, batch_size=2)


class _RecomputeStrategy:
    """forward_step over a real HF model, recomputing the whole sequence (what a backend without a cache does)."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def forward_step(
        self, batch: DataProto, forward_func: Any, *, logits_to_keep: int | None = None
    ) -> dict[str, torch.Tensor]:
        mask = batch.batch["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = self._model(input_ids=batch.batch["input_ids"], attention_mask=mask, position_ids=positions).logits
        return forward_func(batch, logits)


class _ModelStrategy:
    """A strategy holding its HF model: greedy_decode uses the KV cache."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = torch.device("cpu")


@pytest.mark.parametrize("packing_model", [False, True], ids=["sdpa", "packing_model"])
def test_kv_cached_greedy_decode_matches_recomputing_every_pass(tmp_path: Path, packing_model: bool) -> None:
    """Also on a model set up for sequence packing (fsdp2's varlen attention), as an SFT run's validation decodes
    with ``batching.sequence_packing`` on: its padded, cached calls failed before."""
    from transformers import AutoModelForCausalLM

    from roll.strategies.testing import make_tiny_causal_lm
    from roll.strategies.varlen import register_varlen_sdpa

    model = AutoModelForCausalLM.from_pretrained(make_tiny_causal_lm(tmp_path / "lm", preset="nano", seed=3))
    model.eval()
    reference = model
    if packing_model:
        reference = AutoModelForCausalLM.from_pretrained(tmp_path / "lm").eval()
        model.set_attn_implementation(register_varlen_sdpa())
    torch.manual_seed(0)
    ids = torch.randint(3, 500, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of different lengths
    mask[1, :1] = 0
    ids = ids * mask
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask})
    eos = int(ids[2, -1])  # a token the model may well produce, so some rows stop early
    recomputed = greedy_decode(
        _RecomputeStrategy(reference), prompts, max_new_tokens=9, eos_token_id=eos, pad_token_id=0
    )
    cached = greedy_decode(_ModelStrategy(model), prompts, max_new_tokens=9, eos_token_id=eos, pad_token_id=0)
    assert cached.batch["responses"].tolist() == recomputed.batch["responses"].tolist()
    assert cached.batch["response_mask"].tolist() == recomputed.batch["response_mask"].tolist()
    empty = greedy_decode(_ModelStrategy(model), prompts[:0], max_new_tokens=4, eos_token_id=eos, pad_token_id=0)
    assert empty.batch["responses"].shape == (0, 4)
