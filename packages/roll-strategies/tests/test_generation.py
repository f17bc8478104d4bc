"""The per-row seeds every generating backend reads (``sampling_seed``)."""

from __future__ import annotations

import pytest
import torch

from roll.protocol import DataProto
from roll.strategies import GenerationConfig, StrategyError
from roll.strategies.generation import SAMPLING_SEED_KEY, sample_seeds


def prompts_with_seeds(seeds: torch.Tensor | None) -> DataProto:
    ids = torch.tensor([[5, 6], [7, 8], [9, 10]])
    tensors = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if seeds is not None:
        tensors[SAMPLING_SEED_KEY] = seeds
    return DataProto.from_dict(tensors)


def test_each_sample_of_a_row_gets_the_rows_seed_plus_its_index():
    batch = prompts_with_seeds(torch.tensor([100, 7, 2**40]))
    assert sample_seeds(batch, GenerationConfig(num_return_sequences=2)) == [100, 101, 7, 8, 2**40, 2**40 + 1]
    assert sample_seeds(batch, GenerationConfig()) == [100, 7, 2**40]


def test_no_column_or_greedy_decoding_means_no_seeds():
    assert sample_seeds(prompts_with_seeds(None), GenerationConfig(seed=3)) is None
    assert sample_seeds(prompts_with_seeds(torch.tensor([1, 2, 3])), GenerationConfig(temperature=0.0)) is None


def test_bad_seed_columns_are_named():
    with pytest.raises(StrategyError, match=r"rows \[1\] have a negative sampling_seed"):
        sample_seeds(prompts_with_seeds(torch.tensor([1, -5, 3])), GenerationConfig())
    with pytest.raises(StrategyError, match="one integer per prompt row, got shape \\(3,\\) and dtype torch.float32"):
        sample_seeds(prompts_with_seeds(torch.tensor([1.0, 2.0, 3.0])), GenerationConfig())
    with pytest.raises(StrategyError, match="got shape \\(3, 2\\)"):
        sample_seeds(prompts_with_seeds(torch.ones(3, 2, dtype=torch.long)), GenerationConfig())
