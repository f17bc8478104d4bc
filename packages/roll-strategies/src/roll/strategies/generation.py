"""Turning a backend's sampled token lists into the DataProto every generating strategy returns.

See the batch conventions in :mod:`roll.strategies.base`. Backends produce, per prompt, ``n`` lists of token
ids (and their log-probs); :func:`build_generation_output` pads them to ``max_new_tokens`` and lays out the
rows, so HF, vLLM, SGLang and the mock backend return identical structures. :func:`sample_seeds` reads the
optional per-row seeds of the input (``sampling_seed``) that make a row's samples independent of its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roll.protocol import DataProto
from roll.strategies.config import GenerationConfig
from roll.strategies.contract import StrategyError
from roll.strategies.ops import position_ids_from_attention_mask

__all__ = [
    "PROMPT_KEYS",
    "SAMPLING_SEED_KEY",
    "build_generation_output",
    "compact_generation_padding",
    "prompt_token_lists",
    "sample_seeds",
]

# Input tensors that describe the prompt; they are replaced by the prompt+response versions in the output.
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")

SAMPLING_SEED_KEY = "sampling_seed"
"""Optional input column of ``generate``: each prompt row's own sampling seed (int64, one per row)."""


def sample_seeds(batch: DataProto, config: GenerationConfig) -> list[int] | None:
    """The seed of every sample of ``batch`` from its ``sampling_seed`` column, in output row order.

    Sample j of prompt row i gets ``seed_i + j``. ``None`` when the batch has no such column or decoding is greedy
    (nothing is drawn). A backend that honours the column samples each row from its own random stream, so a row's
    tokens do not depend on which rows share its batch or in what order; ``generation_config.seed`` is then unused.
    """
    if SAMPLING_SEED_KEY not in batch.batch.keys() or config.greedy:
        return None
    column = batch.batch[SAMPLING_SEED_KEY]
    if column.dim() != 1 or column.dtype.is_floating_point or column.dtype == torch.bool:
        raise StrategyError(
            f"generate: the {SAMPLING_SEED_KEY!r} column must hold one integer per prompt row, got shape "
            f"{tuple(column.shape)} and dtype {column.dtype}"
        )
    negative = (column < 0).nonzero().flatten().tolist()
    if negative:
        raise StrategyError(f"generate: rows {negative} have a negative {SAMPLING_SEED_KEY}; seeds must be >= 0")
    n = config.num_return_sequences
    return [seed + j for seed in column.tolist() for j in range(n)]


def prompt_token_lists(batch: DataProto) -> list[list[int]]:
    """The unpadded prompt token ids of every row (prompts are left-padded)."""
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"].bool()
    return [row[row_mask].tolist() for row, row_mask in zip(ids, mask)]


def build_generation_output(
    batch: DataProto,
    responses: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]] | None,
    finish_reasons: Sequence[str],
    *,
    num_return_sequences: int,
    max_new_tokens: int,
    pad_token_id: int,
) -> DataProto:
    """Rows for ``len(batch) * num_return_sequences`` samples; sample j of prompt i is row ``i * n + j``."""
    n_rows = len(batch) * num_return_sequences
    if len(responses) != n_rows or len(finish_reasons) != n_rows:
        raise ValueError(
            f"expected {n_rows} responses, got {len(responses)} (and {len(finish_reasons)} finish reasons)"
        )
    response_ids = torch.full((n_rows, max_new_tokens), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((n_rows, max_new_tokens), dtype=torch.long)
    rollout_log_probs = torch.zeros((n_rows, max_new_tokens), dtype=torch.float32)
    for row, tokens in enumerate(responses):
        tokens = list(tokens)[:max_new_tokens]
        if tokens:
            response_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            response_mask[row, : len(tokens)] = 1
            if log_probs is not None:
                rollout_log_probs[row, : len(tokens)] = torch.tensor(
                    list(log_probs[row])[: len(tokens)], dtype=torch.float32
                )
    repeated = batch.repeat(num_return_sequences, interleave=True) if num_return_sequences > 1 else batch
    prompts = repeated.batch["input_ids"]
    prompt_mask = repeated.batch["attention_mask"].long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    extra = repeated.select(
        batch_keys=[k for k in repeated.batch.keys() if isinstance(k, str) and k not in PROMPT_KEYS],
        non_tensor_batch_keys=list(repeated.non_tensor_batch),
    )
    out = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": response_ids,
            "input_ids": torch.cat([prompts, response_ids], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_attention_mask(attention_mask),
            "response_mask": response_mask,
            "rollout_log_probs": rollout_log_probs,
        },
        non_tensors={"finish_reason": list(finish_reasons)},
        meta_info=dict(batch.meta_info),
    )
    return out.union(extra)


def compact_generation_padding(batch: DataProto) -> DataProto:
    """Drop the columns that are padding in every row: leading prompt columns and trailing response columns.

    Generation pads prompts to a fixed width and responses to ``max_new_tokens``; a batch whose longest prompt
    or response is shorter would otherwise pay for those columns in every later forward and backward pass. The
    layout is unchanged (prompts still left-padded, responses right-padded), so it stays valid input for every
    strategy. Tensors of the layout are sliced (views); other columns are left alone. At least one response
    column is kept.
    """
    data = batch.batch
    prompt_width, response_width = data["prompts"].shape[1], data["responses"].shape[1]
    used_prompt = data["attention_mask"][:, :prompt_width].any(0)
    lead = int(used_prompt.int().argmax()) if bool(used_prompt.any()) else prompt_width
    used_response = data["response_mask"].any(0)
    keep = response_width - int(used_response.flip(0).int().argmax()) if bool(used_response.any()) else 0
    keep = max(1, keep)
    if lead == 0 and keep == response_width:
        return batch
    columns: dict[str, torch.Tensor] = {}
    for key in data.keys():
        if not isinstance(key, str):
            continue  # nested keys: generation outputs are flat
        value = data[key]
        if key == "prompts":
            value = value[:, lead:]
        elif key in PROMPT_KEYS and value.dim() == 2 and value.shape[1] == prompt_width + response_width:
            value = value[:, lead : prompt_width + keep]
        elif key in ("responses", "response_mask", "rollout_log_probs"):
            value = value[:, :keep]
        columns[key] = value
    return DataProto.from_dict(columns, batch.non_tensor_batch, meta_info=dict(batch.meta_info))
