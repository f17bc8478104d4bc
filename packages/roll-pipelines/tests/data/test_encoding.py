"""Encoding rows into token ids (tiny ChatML tokenizer) and length filtering with a report."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from roll.pipelines.data import (
    IGNORE_INDEX,
    DataArgs,
    DataError,
    encode_preference,
    encode_prompt,
    encode_sft,
    filter_by_length,
    prepare_examples,
)
from roll.runtime.errors import ConfigError

ROW = {"prompt": "What is 12 + 7?", "response": "The answer is \\boxed{19}."}
PROMPT_TEXT = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"


def args(**overrides: Any) -> DataArgs:
    return DataArgs(file_name="train.jsonl", **overrides)


def targets(tokenizer: Any, encoded: dict[str, list[int]]) -> str:
    return tokenizer.decode([t for t, label in zip(encoded["input_ids"], encoded["labels"]) if label != IGNORE_INDEX])


def test_sft_labels_mask_exactly_the_prompt(tokenizer) -> None:
    encoded = encode_sft(ROW, tokenizer, args())
    ids, labels = encoded["input_ids"], encoded["labels"]
    prompt_len = len(tokenizer.encode(PROMPT_TEXT, add_special_tokens=False))
    assert tokenizer.decode(ids) == PROMPT_TEXT + "The answer is \\boxed{19}.<|im_end|>"
    assert labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert labels[prompt_len:] == ids[prompt_len:]
    assert tokenizer.decode(ids[prompt_len:]) == "The answer is \\boxed{19}.<|im_end|>"
    # Piecewise tokenization equals tokenizing the whole conversation (boundaries are special tokens).
    whole = tokenizer.apply_chat_template(
        [{"role": "user", "content": ROW["prompt"]}, {"role": "assistant", "content": ROW["response"]}],
        tokenize=False,
    )
    assert tokenizer.encode(whole, add_special_tokens=False)[: len(ids)] == ids


def test_sft_system_prompt_is_part_of_the_prompt(tokenizer) -> None:
    encoded = encode_sft(ROW, tokenizer, args(system_prompt="Be brief."))
    assert tokenizer.decode(encoded["input_ids"]).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert targets(tokenizer, encoded) == "The answer is \\boxed{19}.<|im_end|>"


def test_sft_messages_train_on_assistant_turns_only(tokenizer) -> None:
    row = {
        "conv": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "What is 1 + 2?"},
            {"role": "assistant", "content": "3"},
        ]
    }
    encoded = encode_sft(row, tokenizer, args(messages_key="conv", system_prompt="ignored: row has one"))
    ids, labels = encoded["input_ids"], encoded["labels"]
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nS<|im_end|>")
    assert targets(tokenizer, encoded) == "yes<|im_end|>3<|im_end|>"
    starts = [i for i in range(1, len(ids)) if labels[i] != IGNORE_INDEX and labels[i - 1] == IGNORE_INDEX]
    assert len(starts) == 2
    for start in starts:  # each trained span begins right after a generation prompt
        assert tokenizer.decode(ids[:start]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(ids[-1:]) == "<|im_end|>"  # the sequence ends where generation stops


def test_sft_without_template_appends_eos(tokenizer) -> None:
    encoded = encode_sft(ROW, tokenizer, args(apply_chat_template=False, system_prompt="S"))
    assert tokenizer.decode(encoded["input_ids"]) == "S\nWhat is 12 + 7?The answer is \\boxed{19}.<|im_end|>"
    assert targets(tokenizer, encoded) == "The answer is \\boxed{19}.<|im_end|>"


def test_messages_without_template_is_a_config_error(tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"needs a chat template but apply_chat_template is false"):
        encode_sft(
            {"m": [{"role": "user", "content": "x"}]}, tokenizer, args(messages_key="m", apply_chat_template=False)
        )


def test_encode_errors_name_the_row_and_key(tokenizer) -> None:
    with pytest.raises(DataError, match=r"train.jsonl row 3: missing key 'response' \(keys: prompt\)"):
        encode_sft({"prompt": "q"}, tokenizer, args(), where="train.jsonl row 3")
    conv = {"m": [{"role": "assistant", "content": "x"}]}
    with pytest.raises(DataError, match=r"row 0: the conversation starts with an assistant turn"):
        encode_sft(conv, tokenizer, args(messages_key="m"), where="row 0")


def test_preference_encodes_prompt_once_and_responses_to_eos(tokenizer) -> None:
    row = {"prompt": ROW["prompt"], "chosen": "The answer is \\boxed{19}.", "rejected": "The answer is 19."}
    encoded = encode_preference(row, tokenizer, args())
    assert tokenizer.decode(encoded["prompt_ids"]) == PROMPT_TEXT
    assert tokenizer.decode(encoded["chosen_ids"]) == "The answer is \\boxed{19}.<|im_end|>"
    assert tokenizer.decode(encoded["rejected_ids"]) == "The answer is 19.<|im_end|>"


def test_prompt_carries_text_tag_and_extra_keys(tokenizer) -> None:
    row = {"prompt": ROW["prompt"], "ground_truth": "19", "tag": "math", "unused": 1}
    encoded = encode_prompt(row, tokenizer, args(extra_keys=["ground_truth"]))
    assert tokenizer.decode(encoded["prompt_ids"]) == PROMPT_TEXT
    assert {k: v for k, v in encoded.items() if k != "prompt_ids"} == {
        "prompt": ROW["prompt"],
        "tag": "math",
        "ground_truth": "19",
    }
    assert encode_prompt({"prompt": "q"}, tokenizer, args(default_tag="general"))["tag"] == "general"
    with pytest.raises(DataError, match=r"rl.jsonl row 5: missing key 'tag'.*data_args.tag_key \(or data_args.default"):
        encode_prompt({"prompt": "q"}, tokenizer, args(), where="rl.jsonl row 5")


def test_prompt_from_messages_keeps_the_conversation(tokenizer) -> None:
    conv = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "q"},
    ]
    encoded = encode_prompt({"m": conv}, tokenizer, args(messages_key="m", default_tag="chat"))
    assert tokenizer.decode(encoded["prompt_ids"]).endswith("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    assert encoded["prompt"] == "q" and encoded["messages"] == conv


def sft_example(prompt: int, response: int) -> dict[str, list[int]]:
    return {"input_ids": [5] * (prompt + response), "labels": [IGNORE_INDEX] * prompt + [5] * response}


def test_filter_report_counts_every_drop_by_reason(caplog: pytest.LogCaptureFixture) -> None:
    examples = [
        sft_example(3, 4),  # kept: 7 tokens
        sft_example(9, 1),  # prompt_too_long
        sft_example(2, 7),  # response_too_long
        sft_example(5, 5),  # too_long (10 > 8)
        sft_example(4, 0),  # no_target_tokens
        sft_example(4, 4),  # kept: exactly at the limit
    ]
    kept, report = filter_by_length(examples, max_length=8, max_prompt_length=5, max_response_length=5)
    assert kept == [examples[0], examples[5]]
    assert (report.total, report.kept, report.dropped) == (6, 2, 4)
    assert report.dropped_by_reason == {
        "prompt_too_long": 1,
        "response_too_long": 1,
        "too_long": 1,
        "no_target_tokens": 1,
    }
    assert report.dropped_indices == {
        "prompt_too_long": [1],
        "response_too_long": [2],
        "too_long": [3],
        "no_target_tokens": [4],
    }
    assert report.as_metrics("sft")["sft/dropped/too_long"] == 1.0
    assert report.summary("train").startswith("train: kept 2/6 (dropped 4: no_target_tokens=1")
    with caplog.at_level(logging.WARNING):
        report.log("train")
    assert "kept 2/6" in caplog.text


def test_filter_preference_and_prompt_examples() -> None:
    pairs = [
        {"prompt_ids": [1] * 3, "chosen_ids": [2] * 2, "rejected_ids": [3] * 6},  # response 6 > 5
        {"prompt_ids": [1] * 3, "chosen_ids": [2] * 2, "rejected_ids": []},  # empty_response
        {"prompt_ids": [1] * 3, "chosen_ids": [2] * 2, "rejected_ids": [3] * 5},
    ]
    kept, report = filter_by_length(pairs, max_response_length=5)
    assert kept == [pairs[2]] and report.dropped_by_reason == {"response_too_long": 1, "empty_response": 1}
    prompts = [{"prompt_ids": []}, {"prompt_ids": [1, 2]}, {"prompt_ids": [1, 2, 3]}]
    kept, report = filter_by_length(prompts, max_prompt_length=2)
    assert kept == [prompts[1]] and report.dropped_by_reason == {"empty_prompt": 1, "prompt_too_long": 1}


def test_filter_that_drops_everything_raises() -> None:
    with pytest.raises(DataError, match=r"no examples left after length filtering \(train: kept 0/1"):
        filter_by_length([sft_example(5, 5)], max_length=4, name="train")
    kept, report = filter_by_length([sft_example(5, 5)], max_length=4, allow_empty=True)
    assert kept == [] and report.dropped_by_reason == {"too_long": 1}


def test_prepare_examples_encodes_and_filters(tokenizer) -> None:
    rows = [ROW, {"prompt": ROW["prompt"], "response": "x " * 200}]
    kept, report = prepare_examples(rows, "sft", tokenizer, args(max_length=64), name="train")
    assert len(kept) == 1 and report.dropped_by_reason == {"too_long": 1}
    assert kept[0] == encode_sft(ROW, tokenizer, args())


def test_keep_split_reads_one_split_of_a_file_and_counts_the_others(tokenizer) -> None:
    # a GSM8K_zh-style file: train and test rows in one file, told apart by a `split` column
    long_row = {"prompt": ROW["prompt"], "response": "x " * 200, "split": "train"}
    rows = [{**ROW, "split": "test"}, long_row, {**ROW, "split": "train"}, ROW, {**ROW, "split": "test"}]
    kept, report = prepare_examples(rows, "sft", tokenizer, args(max_length=64, keep_split="train"), name="train")
    assert kept == [encode_sft(ROW, tokenizer, args())] * 2  # rows 2 and 3 (row 3 has no split column)
    assert (report.total, report.kept) == (5, 2)
    assert report.dropped_by_reason == {"too_long": 1, "other_split": 2}
    assert report.dropped_indices == {"too_long": [1], "other_split": [0, 4]}  # positions in the loaded rows
    assert report.summary("train") == "train: kept 2/5 (dropped 3: other_split=2, too_long=1)"
    kept, report = prepare_examples(rows, "sft", tokenizer, args(max_length=64), name="train")
    assert (len(kept), report.dropped_by_reason) == (4, {"too_long": 1})


def test_keep_split_that_no_row_has_names_the_values(tokenizer) -> None:
    rows = [{**ROW, "split": "test"}, {**ROW, "split": "dev"}]
    message = r"train: no row has split='train' \(the rows' values: dev, test\); set data_args.keep_split"
    with pytest.raises(DataError, match=message):
        prepare_examples(rows, "sft", tokenizer, args(keep_split="train"), name="train")
