"""Distillation data on the driver: held-out correctness of generated answers, and sequence-level KD batches
(the teacher's greedy responses to prompts, as SFT rows)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roll.pipelines.data import PromptCollator
from roll.pipelines.data.encoding import IGNORE_INDEX
from roll.pipelines.stages import batched
from roll.protocol import DataProto
from roll.runtime import Cluster
from roll.strategies import GenerationConfig

__all__ = ["generated_correctness", "greedy", "responses_as_sft_rows", "states_correct_answer"]

CorrectFn = Callable[[str, str], bool]


def states_correct_answer(prompt: str, response: str) -> bool:
    """Whether ``response`` states the right answer to a synthetic arithmetic ``prompt``, read as the RLVR math
    verifier reads it by default: the last ``\\boxed{}``, else "the answer is N", else the last number."""
    from roll.pipelines.data.synthetic import solve_arithmetic
    from roll.pipelines.rewards.math import extract_answer

    answer = solve_arithmetic(prompt)
    stated = extract_answer(response, "answer_phrase_or_last_number")
    return answer is not None and stated is not None and stated.strip().rstrip(".") == str(answer)


def greedy(max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(temperature=0.0, num_return_sequences=1, max_new_tokens=max_new_tokens)


def _response_ids(out: DataProto) -> list[list[int]]:
    return [row[mask.bool()].tolist() for row, mask in zip(out.batch["responses"], out.batch["response_mask"])]


def generated_correctness(
    engine: Cluster,
    prompts: Sequence[Mapping[str, Any]],
    collator: PromptCollator,
    tokenizer: Any,
    correct_fn: CorrectFn,
    *,
    batch_size: int,
    max_new_tokens: int,
) -> float:
    """Share of held-out ``prompts`` whose greedy response from ``engine`` ``correct_fn`` accepts."""
    right = total = 0
    for batch in batched(prompts, batch_size, collator):
        out = engine.generate(batch, greedy(max_new_tokens))
        texts = tokenizer.batch_decode(_response_ids(out), skip_special_tokens=True)
        for prompt, text in zip(batch.non_tensor_batch["prompt"], texts):
            right += bool(correct_fn(str(prompt), text))
            total += 1
    return right / max(total, 1)


def responses_as_sft_rows(prompts: Sequence[Mapping[str, Any]], generated: DataProto) -> list[dict[str, list[int]]]:
    """SFT examples (``input_ids``, ``labels``) of prompt + the teacher's response; labels on the response only."""
    rows = []
    for example, response in zip(prompts, _response_ids(generated)):
        prompt = list(example["prompt_ids"])
        rows.append({"input_ids": prompt + response, "labels": [IGNORE_INDEX] * len(prompt) + response})
    return rows
