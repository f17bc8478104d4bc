"""Collators: lists of encoded examples -> padded ``DataProto`` batches.

Tensor conventions shared by the training collators (SFT, preference):

* right padding; ``attention_mask`` (int64) is 1 on real tokens; ``position_ids`` count real tokens from 0;
* ``labels`` are aligned with ``input_ids`` (``-100`` on prompt, padding and each sequence's first token), as
  ``roll.strategies.ops.language_model_loss(logits, labels)`` expects (it shifts internally);
* ``loss_mask`` (bool) is ``labels != -100``, also aligned with ``input_ids``: ``loss_mask[:, t]`` says whether
  token ``t`` is a TARGET, i.e. whether the logits at position ``t - 1`` are trained to predict it. For per-token
  log-probs computed as ``log_probs_from_logits(logits[:, :-1], input_ids[:, 1:])`` use ``loss_mask[:, 1:]``.
  ``loss_mask[:, 0]`` is always False.

``meta_info["num_target_tokens"]`` is the number of target tokens in the whole batch (before any split across
workers), for normalising a loss over the global batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from roll.pipelines.data.encoding import IGNORE_INDEX
from roll.pipelines.data.errors import DataError
from roll.pipelines.data.packing import pack_sft_examples
from roll.protocol import DataProto
from roll.runtime.errors import ConfigError
from roll.strategies.ops import position_ids_from_attention_mask

__all__ = ["PreferenceCollator", "PromptCollator", "SFTCollator"]


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{name} must be a positive number of tokens, got {value}")


def _padded_length(longest: int, limit: int, multiple: int | None) -> int:
    """``longest`` rounded up to ``multiple``, but never beyond ``limit``."""
    if multiple:
        longest = -(-longest // multiple) * multiple
    return min(longest, limit)


def _check_lengths(seqs: Sequence[Sequence[int]], limit: int, describe: Callable[[int], str]) -> None:
    for i, seq in enumerate(seqs):
        if len(seq) > limit:
            raise DataError(
                f"{describe(i)} has {len(seq)} tokens, more than the collator's limit of {limit}; drop long examples "
                f"with filter_by_length first or raise the limit"
            )
        if not seq:
            raise DataError(f"{describe(i)} is empty; filter_by_length drops such examples")


def _right_pad(seqs: Sequence[Sequence[int]], length: int, value: int) -> torch.Tensor:
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def _training_batch(
    ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], pad_token_id: int, length: int
) -> dict[str, torch.Tensor]:
    input_ids = _right_pad(ids, length, pad_token_id)
    label_tensor = _right_pad(labels, length, IGNORE_INDEX)
    label_tensor[:, 0] = IGNORE_INDEX
    attention_mask = _right_pad([[1] * len(seq) for seq in ids], length, 0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_attention_mask(attention_mask),
        "labels": label_tensor,
        "loss_mask": label_tensor != IGNORE_INDEX,
    }


class SFTCollator:
    """SFT examples (``input_ids``, ``labels`` from ``encode_sft``) -> a right-padded batch.

    Tensors: ``input_ids``, ``attention_mask``, ``position_ids``, ``labels``, ``loss_mask`` (see the module
    docstring). Rows are padded to the longest example, rounded up to ``pad_to_multiple_of`` but never beyond
    ``max_length``. With ``pack=True`` the examples are first packed (``pack_sft_examples``) into fewer rows of
    at most ``max_length`` tokens; the batch then also has ``segment_ids`` and per-example ``position_ids``, and
    must be run with ``packed_attention_mask`` (see ``roll.pipelines.data.packing``).
    """

    def __init__(
        self, pad_token_id: int, max_length: int, pad_to_multiple_of: int | None = None, *, pack: bool = False
    ) -> None:
        _check_positive("max_length", max_length)
        _check_positive("pad_to_multiple_of", pad_to_multiple_of)
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pack = pack

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> DataProto:
        if not examples:
            raise DataError("SFTCollator got an empty batch")
        rows: Sequence[Mapping[str, Any]] = pack_sft_examples(examples, self.max_length) if self.pack else examples
        ids = [row["input_ids"] for row in rows]
        _check_lengths(ids, self.max_length, lambda i: f"{'packed row' if self.pack else 'example'} {i}")
        length = _padded_length(max(map(len, ids)), self.max_length, self.pad_to_multiple_of)
        tensors = _training_batch(ids, [row["labels"] for row in rows], self.pad_token_id, length)
        if self.pack:
            tensors["position_ids"] = _right_pad([row["position_ids"] for row in rows], length, 0)
            tensors["segment_ids"] = _right_pad([row["segment_ids"] for row in rows], length, 0)
        num_targets = int(tensors["loss_mask"].sum())
        return DataProto.from_dict(tensors, meta_info={"num_target_tokens": num_targets, "num_examples": len(examples)})


class PreferenceCollator:
    """Preference examples (``prompt_ids``, ``chosen_ids``, ``rejected_ids``) -> 2P right-padded rows.

    Rows are interleaved ``[chosen_0, rejected_0, chosen_1, rejected_1, ...]``, each ``prompt + response``.
    Tensors: the training tensors of the module docstring (labels ``-100`` on the prompt), ``pair_index``
    (int64, the example each row comes from) and ``is_chosen`` (bool).
    """

    def __init__(self, pad_token_id: int, max_length: int, pad_to_multiple_of: int | None = None) -> None:
        _check_positive("max_length", max_length)
        _check_positive("pad_to_multiple_of", pad_to_multiple_of)
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> DataProto:
        if not examples:
            raise DataError("PreferenceCollator got an empty batch")
        ids: list[list[int]] = []
        labels: list[list[int]] = []
        for example in examples:
            prompt = list(example["prompt_ids"])
            for key in ("chosen_ids", "rejected_ids"):
                response = list(example[key])
                ids.append(prompt + response)
                labels.append([IGNORE_INDEX] * len(prompt) + response)
        _check_lengths(ids, self.max_length, lambda i: f"pair {i // 2} ({'rejected' if i % 2 else 'chosen'})")
        length = _padded_length(max(map(len, ids)), self.max_length, self.pad_to_multiple_of)
        tensors = _training_batch(ids, labels, self.pad_token_id, length)
        tensors["pair_index"] = torch.arange(len(examples), dtype=torch.long).repeat_interleave(2)
        tensors["is_chosen"] = torch.arange(2 * len(examples)) % 2 == 0
        num_targets = int(tensors["loss_mask"].sum())
        return DataProto.from_dict(tensors, meta_info={"num_target_tokens": num_targets, "num_pairs": len(examples)})


class PromptCollator:
    """RL prompts (from ``encode_prompt``) -> a LEFT-padded batch for generation.

    Tensors: ``input_ids``, ``attention_mask`` and ``position_ids`` (0 at each row's first real token), padded on
    the left to ``prompt_length`` (or to the longest prompt with ``pad_to_longest``). Non-tensor columns: every
    other field of the examples (``prompt``, ``tag``, extra keys such as ``ground_truth``, ``messages``) plus
    ``uid``, a unique string per prompt for grouping its sampled responses.
    """

    def __init__(self, pad_token_id: int, prompt_length: int, *, pad_to_longest: bool = False) -> None:
        _check_positive("prompt_length", prompt_length)
        self.pad_token_id = pad_token_id
        self.prompt_length = prompt_length
        self.pad_to_longest = pad_to_longest

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> DataProto:
        if not examples:
            raise DataError("PromptCollator got an empty batch")
        ids = [list(example["prompt_ids"]) for example in examples]
        _check_lengths(ids, self.prompt_length, lambda i: f"prompt {i}")
        length = max(map(len, ids)) if self.pad_to_longest else self.prompt_length
        input_ids = torch.full((len(ids), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(ids), length), dtype=torch.long)
        for i, seq in enumerate(ids):
            if seq:
                input_ids[i, length - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
                attention_mask[i, length - len(seq) :] = 1
        tensors = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_attention_mask(attention_mask),
        }
        return DataProto.from_dict(tensors, self._non_tensors(examples))

    @staticmethod
    def _non_tensors(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
        keys = [key for key in examples[0] if key != "prompt_ids"]
        for i, example in enumerate(examples):
            if set(example) != set(examples[0]):
                raise DataError(
                    f"prompt {i} has fields {sorted(example)} but prompt 0 has {sorted(examples[0])}; "
                    f"encode every prompt with the same DataArgs"
                )
        columns = {key: [example[key] for example in examples] for key in keys}
        columns["uid"] = [uuid.uuid4().hex for _ in examples]
        return columns
