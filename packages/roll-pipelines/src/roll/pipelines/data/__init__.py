"""roll.pipelines.data: load, validate, encode, batch and resume datasets for SFT, DPO and RL pipelines.

The path of a dataset through a pipeline::

    rows = load_task_rows(data_args, "sft")     # files, save_to_disk folders, hub names, synthetic://; validated
    examples, report = prepare_examples(rows, "sft", tokenizer, data_args)   # encode + length filter (reported)
    batches = StatefulBatchIterator(len(examples), batch_size, seed=data_args.seed)
    batch = SFTCollator(tokenizer.pad_token_id, max_length)([examples[i] for i in next(batches)])  # DataProto

Every data problem raises :class:`DataError` naming the file, the 0-based row, the key and the fix.
"""

from __future__ import annotations

from roll.pipelines.data.args import RESERVED_COLUMNS, DataArgs, Task
from roll.pipelines.data.collators import PreferenceCollator, PromptCollator, SFTCollator
from roll.pipelines.data.encoding import (
    IGNORE_INDEX,
    FilterReport,
    encode_preference,
    encode_prompt,
    encode_sft,
    filter_by_length,
    prepare_examples,
)
from roll.pipelines.data.errors import DataError
from roll.pipelines.data.loading import (
    ChatMessages,
    check_task_rows,
    default_cache_dir,
    load_rows,
    load_task_rows,
    required_columns,
    validate_rows,
)
from roll.pipelines.data.packing import pack_sft_examples, packed_attention_mask
from roll.pipelines.data.sampler import StatefulBatchIterator
from roll.pipelines.data.sources import FILE_SUFFIXES, check_data_reference, read_source
from roll.pipelines.data.synthetic import (
    SYNTHETIC_GENERATORS,
    ArithmeticProblem,
    arithmetic_problems,
    arithmetic_prompts,
    arithmetic_sft,
    extract_boxed,
    is_correct_arithmetic,
    preference_pairs,
    resolve_data_uri,
    solve_arithmetic,
)

__all__ = [
    "FILE_SUFFIXES",
    "IGNORE_INDEX",
    "RESERVED_COLUMNS",
    "SYNTHETIC_GENERATORS",
    "ArithmeticProblem",
    "ChatMessages",
    "DataArgs",
    "DataError",
    "FilterReport",
    "PreferenceCollator",
    "PromptCollator",
    "SFTCollator",
    "StatefulBatchIterator",
    "Task",
    "arithmetic_problems",
    "arithmetic_prompts",
    "arithmetic_sft",
    "check_data_reference",
    "check_task_rows",
    "default_cache_dir",
    "encode_preference",
    "encode_prompt",
    "encode_sft",
    "extract_boxed",
    "filter_by_length",
    "is_correct_arithmetic",
    "load_rows",
    "load_task_rows",
    "pack_sft_examples",
    "packed_attention_mask",
    "preference_pairs",
    "prepare_examples",
    "read_source",
    "required_columns",
    "resolve_data_uri",
    "solve_arithmetic",
    "validate_rows",
]
