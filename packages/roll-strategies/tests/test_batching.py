"""Token-budget micro-batches and packed (padding-free) forwards: plans, layouts, and exactness on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import (
    BatchingArgs,
    LossScale,
    StrategyError,
)
from roll.strategies.batching import (
    MicroBatchPlan,
    packed_layout,
    padded_layout,
    plan_micro_batches,
    restore_row_order,
    split_micro_batches,
)
from roll.strategies.megatron._batching import check_batching
from roll.strategies.megatron.config import MegatronConfig
from roll.strategies.ops import log_probs_from_logits
from roll.strategies.testing.train import tiny_strategy
from roll.strategies.varlen import VARLEN_SDPA, varlen_kwargs

PROMPT, RESPONSE = 6, 12


pytestmark = pytest.mark.usefixtures("isolated_process")


def rl_batch(rows: int = 10, seed: int = 0) -> DataProto:
    """Left-padded prompts + right-padded responses with long-tail lengths (most short, two at the maximum)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 500, (rows, PROMPT + RESPONSE), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(rows):
        prompt = 2 + row % (PROMPT - 1)
        response = RESPONSE if row in (1, rows - 2) else 1 + (row * 5) % 4
        mask[row, : PROMPT - prompt] = 0
        mask[row, PROMPT + response :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    response_mask = mask[:, PROMPT:].clone()
    data = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT:],
        "response_mask": response_mask,
    }
    return DataProto.from_dict(data)


def response_log_probs(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    width = micro.batch["responses"].shape[1]
    picked = log_probs_from_logits(logits[:, -width - 1 : -1], micro.batch["responses"])
    return {"log_probs": picked * micro.batch["response_mask"]}


def pg_loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    """A token-sum loss over response tokens divided by the global count (an exact share of the mini-batch)."""
    log_probs = response_log_probs(micro, logits)["log_probs"]
    weights = torch.linspace(-1.0, 1.0, log_probs.shape[1])
    return -(log_probs * weights).sum() / scale.num_tokens, {}


# --- plans and layouts (pure) -----------------------------------------------------------------------------------
def test_token_budget_plans_cover_every_row_once_within_the_budget():
    lengths = [3, 40, 5, 2, 38, 7, 1, 9, 4, 6]
    padded = plan_micro_batches(lengths, MicroBatchPlan(rows=4, max_tokens=48, round_to=4))
    packed = plan_micro_batches(lengths, MicroBatchPlan(rows=4, max_tokens=48, round_to=4, packing=True))
    for groups in (padded, packed):
        assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in padded:  # rows x rounded longest row
        assert len(group) * -(-max(lengths[i] for i in group) // 4) * 4 <= 48
    for group in packed:
        assert -(-sum(lengths[i] for i in group) // 4) * 4 <= 48
    assert len(packed) < len(padded)  # packing fills micro-batches with the short rows the long ones leave room for
    fixed = plan_micro_batches(lengths, MicroBatchPlan(rows=4))
    assert fixed == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    alone = plan_micro_batches([100, 3], MicroBatchPlan(rows=1, max_tokens=10))
    assert alone == [[0], [1]]  # a row over the budget runs alone rather than being dropped


def test_split_and_restore_row_order():
    batch = rl_batch()
    micros, order = split_micro_batches(batch, MicroBatchPlan(rows=3, max_tokens=40))
    assert order is not None and sorted(order.tolist()) == list(range(len(batch)))
    gathered = {"ids": torch.cat([m.batch["input_ids"] for m in micros])}
    assert torch.equal(restore_row_order(gathered, order)["ids"], batch.batch["input_ids"])


def test_trimmed_window_drops_padding_columns_and_restores_the_layout():
    batch = rl_batch().select_idxs(torch.tensor([0, 2, 3]))  # short rows only
    mask = batch.batch["attention_mask"]
    layout = padded_layout(batch, RESPONSE + 1, trim=True, round_to=1)
    used = mask.any(0).nonzero().flatten()
    assert layout.inputs["input_ids"].shape == (3, int(used[-1] - used[0] + 1))
    # Logits that encode their window column come back at the original columns, zeros elsewhere.
    window = layout.inputs["input_ids"].shape[1]
    fake = torch.arange(window, dtype=torch.float32).view(1, window, 1).expand(3, window, 2)[:, -layout.keep :]
    restored = layout.restore(fake)
    assert restored.shape == (3, RESPONSE + 1, 2)
    first = PROMPT + RESPONSE - (RESPONSE + 1)
    for column in range(RESPONSE + 1):
        original = first + column
        expected = float(original - int(used[0])) if int(used[0]) <= original <= int(used[-1]) else 0.0
        assert restored[0, column, 0].item() == expected


def test_packed_layout_restarts_positions_and_rejects_other_positions():
    batch = rl_batch(rows=3)
    layout = packed_layout(batch, None, round_to=8, pad_token_id=0)
    lengths = batch.batch["attention_mask"].sum(1).tolist()
    expected = [p for n in lengths for p in range(n)]
    total = -(-sum(lengths) // 8) * 8
    assert layout.inputs["position_ids"].tolist() == [expected + list(range(total - len(expected)))]
    assert layout.inputs["input_ids"].shape == (1, total) and "attention_mask" not in layout.inputs
    shifted = batch.batch["position_ids"] + 1
    bad = DataProto.from_dict({**batch.batch.to_dict(), "position_ids": shifted})
    with pytest.raises(StrategyError, match="position_ids that count 0, 1, 2"):
        packed_layout(bad, None)


def test_megatron_packing_helpers():
    bounds = varlen_kwargs(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    assert bounds["cu_seq_lens_q"].tolist() == [0, 3, 5, 6] and bounds["max_length_q"] == 3
    with pytest.raises(StrategyError, match="start every sequence"):
        varlen_kwargs(torch.tensor([[1, 2, 0]]))
    check_batching(BatchingArgs(sequence_packing=True), MegatronConfig(transformer_impl="transformer_engine"))
    with pytest.raises(ConfigError, match="transformer_engine"):
        check_batching(BatchingArgs(sequence_packing=True), MegatronConfig())
    dynamic = BatchingArgs(dynamic_batching_in_train=True, max_tokens_per_microbatch_in_train=64)
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size=1"):
        check_batching(dynamic, MegatronConfig(pipeline_model_parallel_size=2))


def test_settings_need_a_budget():
    with pytest.raises(ConfigError, match="max_tokens_per_microbatch_in_infer"):
        BatchingArgs(dynamic_batching_in_infer=True)


# --- exactness on a tiny model ------------------------------------------------------------------------------------
MODES: dict[str, dict[str, Any]] = {
    "dynamic": {"dynamic_batching_in_train": True, "max_tokens_per_microbatch_in_train": 48},
    "packed": {"sequence_packing": True},
    "both": {
        "sequence_packing": True,
        "dynamic_batching_in_train": True,
        "max_tokens_per_microbatch_in_train": 40,
        "sequence_length_round_in_train": 8,
    },
}


def _infer_settings(train: dict[str, Any]) -> dict[str, Any]:
    return {key.replace("_in_train", "_in_infer"): value for key, value in train.items()}


def make(model: Path, strategy: str, batching: dict[str, Any], attn: str = "sdpa"):
    return tiny_strategy(
        model,
        strategy=strategy,
        model_args={"attn_implementation": attn},
        training_args={"per_device_train_batch_size": 3, "max_grad_norm": None},
        infer_batch_size=4,
        batching=BatchingArgs(**batching),
    )


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", list(MODES))
def test_forward_log_probs_equal_the_padded_path(tiny_model, mode, attn):
    batch = rl_batch()
    reference = make(tiny_model, "fsdp2_infer", {}, attn)
    strategy = make(tiny_model, "fsdp2_infer", _infer_settings(MODES[mode]), attn)
    for keep in (None, RESPONSE + 1):
        want = reference.forward_step(batch, response_log_probs, logits_to_keep=keep)["log_probs"]
        got = strategy.forward_step(batch, response_log_probs, logits_to_keep=keep)["log_probs"]
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0.0)
    assert strategy.padding.padded_fraction < reference.padding.padded_fraction
    if MODES[mode].get("sequence_packing"):  # fsdp2 runs packed rows per sequence (cu_seqlens), not a dense mask
        assert strategy.model.config._attn_implementation == VARLEN_SDPA
    if MODES[mode].get("sequence_packing") and "sequence_length_round_in_train" not in MODES[mode]:
        assert strategy.padding.padded_fraction == 0.0


def test_a_packing_model_still_runs_padded_calls_with_a_kv_cache(tiny_model):
    """A model set up for packing (varlen attention) is also called on padded rows, e.g. by greedy decoding with a
    KV cache in an SFT run's validation; those calls must equal plain SDPA's (they failed before)."""
    from transformers import DynamicCache

    batch = rl_batch(rows=4)
    ids, mask = batch.batch["input_ids"][:, :PROMPT], batch.batch["attention_mask"][:, :PROMPT]
    reference = make(tiny_model, "fsdp2_infer", {})
    packing = make(tiny_model, "fsdp2_infer", {"sequence_packing": True})
    assert packing.model.config._attn_implementation == VARLEN_SDPA

    def decode(strategy) -> list[torch.Tensor]:
        cache, step_ids, step_mask, logits = DynamicCache(), ids, mask, []
        with torch.no_grad():
            for _ in range(3):
                out = strategy.model(
                    input_ids=step_ids, attention_mask=step_mask, past_key_values=cache, use_cache=True
                )
                logits.append(out.logits[:, -1].float())
                step_ids = out.logits[:, -1].argmax(-1, keepdim=True)
                step_mask = torch.cat([step_mask, torch.ones_like(step_ids)], dim=1)
        return logits

    for want, got in zip(decode(reference), decode(packing), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0.0)
    with torch.no_grad():  # and one unpadded row without a cache
        one = {"input_ids": batch.batch["input_ids"][1:2]}
        torch.testing.assert_close(packing.model(**one).logits, reference.model(**one).logits, atol=1e-5, rtol=0.0)


def test_hf_infer_packed_and_dynamic_log_probs_equal_the_padded_path(tiny_model):
    batch = rl_batch(seed=3)
    want = make(tiny_model, "hf_infer", {}).forward_step(batch, response_log_probs)["log_probs"]
    for mode in MODES.values():
        got = make(tiny_model, "hf_infer", _infer_settings(mode)).forward_step(batch, response_log_probs)
        torch.testing.assert_close(got["log_probs"], want, atol=1e-5, rtol=0.0)


def _gradients(strategy, batch: DataProto) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Gradients of one train_step (captured just before the optimizer would use them)."""
    captured: dict[str, torch.Tensor] = {}

    def capture(*_: Any, **__: Any) -> None:
        for name, param in strategy.model.named_parameters():
            if param.grad is not None:
                grad = param.grad
                captured[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).clone()

    strategy.optimizer.step = capture
    metrics = strategy.train_step(batch, pg_loss, loss_mask_key="response_mask", logits_to_keep=RESPONSE + 1)
    return captured, metrics


@pytest.mark.parametrize("mode", list(MODES))
def test_train_step_gradients_equal_the_fixed_size_path(tiny_model, mode):
    batch = rl_batch(seed=1)
    want, want_metrics = _gradients(make(tiny_model, "fsdp2_train", {}), batch)
    got, metrics = _gradients(make(tiny_model, "fsdp2_train", MODES[mode]), batch)
    assert want.keys() == got.keys() and len(want) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=0.0, msg=lambda m, n=name: f"{n}: {m}")
    assert metrics["loss"] == pytest.approx(want_metrics["loss"], abs=1e-5)
    fixed_path_padding = 1.0 - batch.batch["attention_mask"].float().mean().item()  # every column of every row
    assert metrics["batching/padded_fraction"] < fixed_path_padding
