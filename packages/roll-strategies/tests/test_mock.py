from __future__ import annotations

import pytest
import torch

from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import (
    GenerationConfig,
    LossScale,
    StrategyArgs,
    StrategyError,
    StrategyWorker,
    StrategyWorkerConfig,
)


def make_worker() -> StrategyWorker:
    config = StrategyWorkerConfig(
        name="mock", strategy_args=StrategyArgs(strategy_name="mock_infer", strategy_config={"vocab_size": 50})
    )
    worker = StrategyWorker(config)
    worker.initialize()
    return worker


def prompts() -> DataProto:
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask}, {"answer": ["a", "b"]})


def test_mock_generation_layout_follows_the_contract():
    strategy = make_worker().strategy
    out = strategy.generate(prompts(), GenerationConfig(max_new_tokens=6, num_return_sequences=2))
    assert len(out) == 4
    assert out["answer"].tolist() == ["a", "a", "b", "b"]
    assert out["prompts"].shape == (4, 3) and out["responses"].shape == (4, 6)
    assert out["input_ids"].shape == (4, 9)
    assert torch.equal(out["input_ids"][:, 3:], out["responses"])
    assert torch.equal(out["attention_mask"][:, 3:], out["response_mask"])
    assert out["attention_mask"][0, :3].tolist() == [0, 1, 1]
    lengths = out["response_mask"].sum(-1).tolist()
    # Prompt sums 11 and 24: lengths 1 + (sum + j) % 6 -> 6 (hits the budget), 1, 1, 2, plus EOS when it fits.
    assert lengths == [6, 2, 2, 3]
    assert out["finish_reason"].tolist() == ["length", "stop", "stop", "stop"]
    assert out["rollout_log_probs"][0, :2].tolist() == [-0.5, -0.5099999904632568]
    assert (out["rollout_log_probs"] * (1 - out["response_mask"])).abs().sum() == 0


def test_mock_forward_puts_half_the_mass_on_the_next_token():
    strategy = make_worker().strategy
    from roll.strategies.ops import log_probs_from_logits

    result = strategy.forward_step(
        prompts(), lambda micro, logits: {"lp": log_probs_from_logits(logits, (micro.batch["input_ids"] + 1) % 50)}
    )
    torch.testing.assert_close(result["lp"], torch.full((2, 3), torch.log(torch.tensor(0.5)).item()))


def test_mock_forward_honours_logits_to_keep_and_rejects_bad_values():
    strategy = make_worker().strategy
    widths: list[int] = []

    def forward(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        widths.append(logits.shape[1])
        return {"last": logits[:, -1]}

    full = strategy.forward_step(prompts(), forward)["last"]
    kept = strategy.forward_step(prompts(), forward, logits_to_keep=2)["last"]
    assert widths == [3, 2]
    torch.testing.assert_close(kept, full)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(StrategyError, match="logits_to_keep must be a positive number"):
            strategy.forward_step(prompts(), forward, logits_to_keep=bad)


def test_loss_scale_is_checked_where_it_is_made():
    assert LossScale(num_tokens=0, num_seqs=1).num_tokens == 0  # an all-masked mini-batch is valid
    with pytest.raises(StrategyError, match="num_seqs must be an integer >= 1"):
        LossScale(num_tokens=3, num_seqs=0)
    with pytest.raises(StrategyError, match="num_tokens must be an integer >= 0"):
        LossScale(num_tokens=-1, num_seqs=2)
    with pytest.raises(StrategyError, match="num_tokens"):
        LossScale(num_tokens=2.0, num_seqs=2)  # type: ignore[arg-type]


def test_compacting_drops_columns_that_are_padding_in_every_row():
    from roll.strategies.generation import compact_generation_padding

    strategy = make_worker().strategy
    wide = DataProto.from_dict(
        {
            "input_ids": torch.tensor([[0, 0, 0, 5, 6], [0, 0, 7, 8, 9]]),
            "attention_mask": torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]),
        },
        {"answer": ["a", "b"]},
    )
    # Mock response lengths here are 13, 14, 6 and 7 (with EOS; see the mock's docstring), so 6 of 20 response
    # columns are padding in every row; the widest prompt uses 3 of 5 columns.
    out = strategy.generate(wide, GenerationConfig(max_new_tokens=20, num_return_sequences=2))
    out.batch["scores"] = torch.arange(4.0)
    compact = compact_generation_padding(out)
    lengths = out["response_mask"].sum(-1)
    keep = int(lengths.max())
    assert keep == 14
    assert compact["prompts"].shape == (4, 3) and compact["responses"].shape == (4, keep)
    assert compact["input_ids"].shape == (4, 3 + keep)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(compact[key], out[key][:, 2 : 5 + keep]), key
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(compact[key], out[key][:, :keep]), key
    assert torch.equal(compact["scores"], out["scores"])
    assert compact["answer"].tolist() == out["answer"].tolist()
    assert out["response_mask"][:, keep:].sum() == 0 and out["attention_mask"][:, :2].sum() == 0
    # Nothing to drop: the same object comes back.
    assert compact_generation_padding(compact) is compact


def test_deployment_fields_are_derived_before_validation():
    cpu = StrategyWorkerConfig(name="cpu", strategy_args=StrategyArgs(strategy_name="mock_infer"))
    assert cpu.num_threads == "all" and cpu.world_size == 1  # 'auto' on a CPU role
    gpu = StrategyWorkerConfig(
        name="gpu", device_mapping=[0, 1], strategy_args=StrategyArgs(strategy_name="mock_infer")
    )
    assert gpu.num_threads is None and gpu.num_gpus_per_worker == 1 and gpu.world_size == 2
    # Dumped and loaded again, a config is the same (the derived values are plain fields).
    assert StrategyWorkerConfig.model_validate(gpu.model_dump()) == gpu
    with pytest.raises(ConfigError, match="num_gpus_per_worker=2 but each mock_infer worker uses 1 device"):
        StrategyWorkerConfig(
            name="gpu",
            device_mapping=[0, 1],
            num_gpus_per_worker=2,
            strategy_args=StrategyArgs(strategy_name="mock_infer"),
        )
