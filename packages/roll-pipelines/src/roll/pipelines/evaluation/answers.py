"""Greedy-generation evaluation for pipelines that train on demonstrations (SFT) or preferences (DPO).

Held-out examples give the prompts and the reference answers: an SFT example's prompt is everything before its
first target token and its reference the target text; a preference pair's reference is its chosen response.
The training role answers the prompts greedily (``generate_greedy``, forward passes only) and the answers are
graded by :mod:`.grading`: ``correct`` when the final answer matches the reference's, ``format`` when it is
boxed, ``exact_match`` when the whole response equals the reference.

:func:`answer_only_examples` rewrites SFT examples so that only the tokens of the final answer are targets: the
loss on them is the part of the validation loss a fixed response template cannot lower.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roll.pipelines.data import IGNORE_INDEX, PromptCollator
from roll.pipelines.evaluation.grading import answer_metrics, final_answer, grade_answers
from roll.runtime import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "AnswerItem",
    "HeldOutAnswers",
    "answer_items_from_pairs",
    "answer_items_from_sft",
    "answer_loss",
    "answer_only_examples",
    "generation_eval",
]


@dataclass(frozen=True)
class AnswerItem:
    """A held-out prompt (token ids, ending with the generation prompt), its reference response and answer."""

    prompt_ids: list[int]
    reference: str
    ground_truth: str


def _first_target_span(labels: Sequence[int]) -> tuple[int, int]:
    """[start, end) of the first run of target positions (``labels != -100``); (n, n) when there is none."""
    start = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))
    end = start
    while end < len(labels) and labels[end] != IGNORE_INDEX:
        end += 1
    return start, end


def answer_items_from_sft(
    examples: Sequence[Mapping[str, Any]], tokenizer: Any, *, limit: int | None = None
) -> tuple[list[AnswerItem], int]:
    """Items from SFT examples (``input_ids``, ``labels``): prompt = tokens before the first target, reference =
    the first assistant turn. Returns the items and how many examples were skipped for having no final answer."""
    items: list[AnswerItem] = []
    skipped = 0
    for example in examples[:limit] if limit else examples:
        ids, labels = list(example["input_ids"]), list(example["labels"])
        start, end = _first_target_span(labels)
        reference = tokenizer.decode(ids[start:end], skip_special_tokens=True)
        truth = final_answer(reference)
        if start == 0 or truth is None:
            skipped += 1
            continue
        items.append(AnswerItem(prompt_ids=ids[:start], reference=reference, ground_truth=truth))
    return items, skipped


def answer_items_from_pairs(
    pairs: Sequence[Mapping[str, Any]], tokenizer: Any, *, limit: int | None = None
) -> tuple[list[AnswerItem], int]:
    """Items from preference examples (``prompt_ids``, ``chosen_ids``): the chosen response is the reference."""
    items: list[AnswerItem] = []
    skipped = 0
    for pair in pairs[:limit] if limit else pairs:
        reference = tokenizer.decode(list(pair["chosen_ids"]), skip_special_tokens=True)
        truth = final_answer(reference)
        if truth is None:
            skipped += 1
            continue
        items.append(AnswerItem(prompt_ids=list(pair["prompt_ids"]), reference=reference, ground_truth=truth))
    return items, skipped


def _answer_positions(target_ids: Sequence[int], tokenizer: Any) -> list[int] | None:
    """Offsets (within ``target_ids``) of the tokens that spell the final answer, or None if it is not found."""
    pieces = [tokenizer.decode([token], skip_special_tokens=False) for token in target_ids]
    text = "".join(pieces)
    answer = final_answer(tokenizer.decode(list(target_ids), skip_special_tokens=True))
    if not answer:
        return None
    begin = text.rfind(answer)
    if begin < 0:
        return None
    end = begin + len(answer)
    positions, offset = [], 0
    for i, piece in enumerate(pieces):
        if offset < end and offset + len(piece) > begin:
            positions.append(i)
        offset += len(piece)
    return positions or None


def answer_only_examples(examples: Sequence[Mapping[str, Any]], tokenizer: Any) -> tuple[list[dict[str, Any]], int]:
    """SFT examples whose only targets are the final answer's tokens (in the first assistant turn).

    Returns the rewritten examples and how many were left out because no final answer was found in them.
    """
    out: list[dict[str, Any]] = []
    skipped = 0
    for example in examples:
        ids, labels = list(example["input_ids"]), list(example["labels"])
        start, end = _first_target_span(labels)
        positions = _answer_positions(ids[start:end], tokenizer) if end > start else None
        if positions is None:
            skipped += 1
            continue
        answer_labels = [IGNORE_INDEX] * len(ids)
        for i in positions:
            answer_labels[start + i] = ids[start + i]
        out.append({"input_ids": ids, "labels": answer_labels})
    return out, skipped


def generation_eval(
    cluster: Any,
    items: Sequence[AnswerItem],
    tokenizer: Any,
    *,
    max_new_tokens: int,
    batch_size: int,
    prefix: str = "val/",
) -> dict[str, float]:
    """Greedy answers of ``cluster`` (a role with ``generate_greedy``) to ``items``, graded.

    Metrics: ``correct``, ``format``, ``correct_and_format`` (see :func:`answer_metrics`), ``exact_match`` and
    ``generated`` (how many prompts were answered).
    """
    if not items:
        return {}
    collator = PromptCollator(tokenizer.pad_token_id, max(len(item.prompt_ids) for item in items), pad_to_longest=True)
    texts: list[str] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        out = cluster.generate_greedy(collator([{"prompt_ids": item.prompt_ids} for item in chunk]), max_new_tokens)
        rows = zip(out.batch["responses"], out.batch["response_mask"])
        texts += tokenizer.batch_decode([row[mask.bool()].tolist() for row, mask in rows], skip_special_tokens=True)
    grades = grade_answers(texts, [item.ground_truth for item in items])
    metrics = answer_metrics(grades, prefix=prefix)
    exact = sum(text.strip() == item.reference.strip() for text, item in zip(texts, items))
    metrics[f"{prefix}exact_match"] = exact / len(items)
    metrics[f"{prefix}generated"] = float(len(items))
    return metrics


def answer_loss(
    cluster: Any, examples: Sequence[Mapping[str, Any]], collator: Any, *, batch_size: int, prefix: str = "val/"
) -> dict[str, float]:
    """Mean NLL per answer token of :func:`answer_only_examples` output, scored by ``compute_sequence_log_probs``."""
    nll, tokens = 0.0, 0
    for start in range(0, len(examples), batch_size):
        out = cluster.compute_sequence_log_probs(collator(examples[start : start + batch_size]))
        nll -= float(out.batch["seq_log_prob"].sum())
        tokens += int(out.batch["num_target_tokens"].sum())
    if not tokens:
        return {}
    return {f"{prefix}answer_loss": nll / tokens, f"{prefix}answer_tokens": float(tokens)}


class HeldOutAnswers:
    """Held-out prompts with reference answers, prepared once; calling it with a role evaluates that role.

    ``rows`` caps how many examples are used (0 turns the evaluation off); the answers are generated greedily
    with ``max_new_tokens`` and ``batch_size`` prompts per call.
    """

    def __init__(self, items: list[AnswerItem], tokenizer: Any, *, max_new_tokens: int, batch_size: int) -> None:
        self.items = items
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    @classmethod
    def build(
        cls, examples: Sequence[Mapping[str, Any]], tokenizer: Any, *, rows: int, max_new_tokens: int, batch_size: int
    ) -> HeldOutAnswers:
        """From SFT examples (``labels``) or preference pairs (``chosen_ids``); raises if none has an answer."""
        if rows <= 0 or not examples:
            return cls([], tokenizer, max_new_tokens=max_new_tokens, batch_size=batch_size)
        make = answer_items_from_pairs if "chosen_ids" in examples[0] else answer_items_from_sft
        items, skipped = make(examples, tokenizer, limit=rows)
        if not items:
            raise ConfigError(
                f"val_generation_rows={rows} asks for a generation eval, but none of the first {skipped} held-out "
                f"responses states a final answer (\\boxed{{}}, 'the answer is ...' or a number); set "
                f"val_generation_rows=0 for this data"
            )
        if skipped:
            logger.warning(
                "generation eval: %d of %d held-out responses state no final answer; left out",
                skipped,
                skipped + len(items),
            )
        return cls(items, tokenizer, max_new_tokens=max_new_tokens, batch_size=batch_size)

    def __call__(self, cluster: Any, prefix: str = "val/") -> dict[str, float]:
        return generation_eval(
            cluster,
            self.items,
            self.tokenizer,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            prefix=prefix,
        )
