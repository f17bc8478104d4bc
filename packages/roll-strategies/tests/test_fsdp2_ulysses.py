"""Ulysses sequence parallelism in fsdp2_train: two ranks (Ray workers, gloo) in one SP group compute the same
log-probs, losses and gradients as one rank without it, for padded and packed rows."""

from __future__ import annotations

import types
import uuid
from typing import Any

import pytest
import torch

from roll.protocol import DataProto, Dispatch, register
from roll.runtime import ConfigError
from roll.runtime.testing import ship_module_by_value
from roll.strategies import (
    LossScale,
    StrategyArgs,
    StrategyError,
    StrategyWorker,
    create_strategy,
)
from roll.strategies.fsdp2.config import Fsdp2Config
from roll.strategies.ops import language_model_loss, log_probs_from_logits
from roll.strategies.testing.train import running_cluster, tiny_strategy, tiny_worker_config
from roll.strategies.ulysses import check_heads

ship_module_by_value(__name__)

TOL = {"atol": 1e-5, "rtol": 0.0}
PROMPT, RESPONSE = 6, 7  # 13 columns: not a multiple of the group, so the sequence is padded


pytestmark = pytest.mark.usefixtures("isolated_process")


def rl_batch(rows: int, seed: int) -> DataProto:
    """Left-padded prompts and right-padded responses of different lengths, as a rollout produces them."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 500, (rows, PROMPT + RESPONSE), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 3] = 0  # prompt padding
        mask[row, PROMPT + RESPONSE - (row * 2) % 5 :] = 0  # response padding
    response_mask = mask[:, PROMPT:].clone()
    data = {"input_ids": ids, "attention_mask": mask, "response_mask": response_mask}
    return DataProto.from_dict(data)


def response_log_probs(micro: DataProto, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    labels = micro.batch["input_ids"][:, -RESPONSE:]
    return {"log_probs": log_probs_from_logits(logits[:, -RESPONSE - 1 : -1], labels)}


def pg_loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    """A token-mean policy-gradient-like loss on the response (advantages fixed per row)."""
    labels = micro.batch["input_ids"][:, -RESPONSE:]
    log_probs = log_probs_from_logits(logits[:, -RESPONSE - 1 : -1], labels)
    mask = micro.batch["response_mask"].float()
    advantages = torch.linspace(-1.0, 1.0, len(micro))[:, None]
    loss = -(advantages * log_probs * mask).sum() / scale.num_tokens
    return loss, {}


def sft_loss(micro: DataProto, logits: torch.Tensor, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    """Next-token loss on every real token predicted from a real token (left padding is never a context)."""
    mask = micro.batch["attention_mask"] != 0
    predicted = mask & torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    labels = micro.batch["input_ids"].masked_fill(~predicted, -100)
    loss, _ = language_model_loss(logits, labels, num_tokens=scale.num_tokens)
    return loss, {}


def train_with_grads(strategy, batch: DataProto, loss: str) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One train_step with the loss named ``loss``; also the full gradients the optimizer stepped with (read before
    they are zeroed)."""
    grads: dict[str, torch.Tensor] = {}
    zero_grad = strategy.optimizer.zero_grad

    def capture(self, set_to_none: bool = True) -> None:
        for name, param in strategy.model.named_parameters():
            grad = param.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
        zero_grad(set_to_none=set_to_none)

    strategy.optimizer.zero_grad = types.MethodType(capture, strategy.optimizer)
    try:
        # The policy loss reads the response's logits only: the head runs on those positions (split over the group).
        keep = RESPONSE + 1 if loss == "pg" else None
        metrics = strategy.train_step(batch, LOSSES[loss], loss_mask_key="response_mask", logits_to_keep=keep)
    finally:
        strategy.optimizer.zero_grad = zero_grad
    return metrics, grads


LOSSES = {"pg": pg_loss, "sft": sft_loss}


def assert_real_close(got: torch.Tensor, expected: torch.Tensor, batch: DataProto) -> None:
    """Equal at the response tokens (padding positions hold whatever each attention path leaves there)."""
    real = batch.batch["response_mask"].bool()
    assert real.sum() > 10
    torch.testing.assert_close(got[real], expected[real], **TOL)


class UlyssesTestWorker(StrategyWorker):
    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE)
    def log_probs(self, data: DataProto, keep: int | None = None) -> DataProto:
        return DataProto.from_dict(self.strategy.forward_step(data, response_log_probs, logits_to_keep=keep))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train(self, data: DataProto, loss: str) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """Every rank gets the whole batch (one SP group is one data-parallel rank)."""
        return train_with_grads(self.strategy, data, loss)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def log_probs_each(self, data: DataProto) -> DataProto:
        """Each rank its own batch (to show that a group whose ranks got different rows fails clearly)."""
        return DataProto.from_dict(self.strategy.forward_step(data, response_log_probs))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restart(self, strategy_config: dict[str, Any], packing: bool, checkpointing: bool) -> tuple[int, ...]:
        batching = self.worker_config.batching.model_copy(update={"sequence_packing": packing})
        model_args = self.worker_config.model_args.model_copy(update={"gradient_checkpointing": checkpointing})
        args = StrategyArgs(strategy_name="fsdp2_train", strategy_config=strategy_config)
        update = {"strategy_args": args, "batching": batching, "model_args": model_args}
        self.worker_config = self.worker_config.model_copy(update=update)
        self.strategy.shutdown()
        self.strategy = create_strategy(self)
        self.strategy.initialize()
        info = self.strategy.rank_info
        return info.dp_rank, info.dp_size, info.cp_rank, info.cp_size


@pytest.fixture(scope="module")
def sp_pair(tiny_model, resources):
    config = tiny_worker_config(tiny_model, world_size=2, system_envs={"OMP_NUM_THREADS": "1"}, infer_batch_size=2)
    with running_cluster(f"ulysses-{uuid.uuid4().hex[:8]}", UlyssesTestWorker, resources, config) as cluster:
        yield cluster


# --- configuration ---------------------------------------------------------------------------------------------
def test_heads_must_split_over_the_group():
    check_heads(types.SimpleNamespace(num_attention_heads=8, num_key_value_heads=2), 4)  # kv heads repeated
    check_heads(types.SimpleNamespace(num_attention_heads=8, num_key_value_heads=8), 4)
    with pytest.raises(StrategyError, match="num_attention_heads=6 is not divisible by ulysses_size=4"):
        check_heads(types.SimpleNamespace(num_attention_heads=6, num_key_value_heads=6), 4)
    with pytest.raises(StrategyError, match="num_key_value_heads=3 and ulysses_size=2"):
        check_heads(types.SimpleNamespace(num_attention_heads=12, num_key_value_heads=3), 2)
    with pytest.raises(ConfigError, match="ulysses_size"):
        Fsdp2Config(ulysses_size=0)


def test_world_must_be_a_multiple_of_the_group(tiny_model):
    with pytest.raises(StrategyError, match="ulysses_size=2 must divide the role's world size 1"):
        tiny_strategy(tiny_model, strategy_config={"ulysses_size": 2})


# --- two ranks, one SP group -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("packing", "fsdp_size"), [(False, None), (True, None), (False, 1)], ids=["padded", "packed", "padded-hsdp"]
)
def test_two_rank_ulysses_matches_one_rank(sp_pair, tiny_model, packing, fsdp_size):
    """ulysses_size=2 on 2 ranks (nano: 2 heads, 1 kv head, so kv heads are repeated; 13 columns, padded to 14):
    response log-probs, one train step's loss and gradients and the next step's log-probs equal the
    single-process path without SP. padded-hsdp: parameters replicated on both ranks (fsdp_size 1), not sharded."""
    probe, batch = rl_batch(5, seed=3), rl_batch(4, seed=4)
    results = {}
    for loss in ("pg", "sft"):
        reference = tiny_strategy(tiny_model, infer_batch_size=2, batching={"sequence_packing": packing})
        before = reference.forward_step(probe, response_log_probs)["log_probs"]
        metrics, grads = train_with_grads(reference, batch, loss)
        after = reference.forward_step(probe, response_log_probs)["log_probs"]
        results[loss] = before, metrics, grads, after
        reference.shutdown()

    for loss, (before, metrics, grads, after) in results.items():
        # Packed rows also recompute activations in backward (the all-to-alls run again there).
        infos = sp_pair.restart({"ulysses_size": 2, "fsdp_size": fsdp_size}, packing, packing)
        sp_pair._rank_infos = sp_pair._fetch_rank_infos()  # restart is not `initialize`: refresh the dispatch topology
        assert [info.dp_size for info in sp_pair.rank_infos] == [1, 1]
        assert infos == [(0, 1, 0, 2), (0, 1, 1, 2)]  # one data-parallel rank, two sequence slices
        assert_real_close(sp_pair.log_probs(probe).batch["log_probs"], before, probe)
        # With logits_to_keep each rank's head runs on its share of the kept positions (padded rows: 2 and 6 of 8).
        assert_real_close(sp_pair.log_probs(probe, keep=RESPONSE + 1).batch["log_probs"], before, probe)
        (m0, g0), (m1, g1) = sp_pair.train(batch, loss)
        assert m0["loss"] == m1["loss"] == pytest.approx(metrics["loss"], abs=1e-5), loss
        assert m0["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5), loss
        assert g0.keys() == grads.keys() and all(torch.equal(g0[name], g1[name]) for name in g0)
        for name, grad in grads.items():
            torch.testing.assert_close(g0[name], grad, **TOL, msg=lambda m, n=name, k=loss: f"{k} {n}: {m}")
        assert_real_close(sp_pair.log_probs(probe).batch["log_probs"], after, probe)


def test_ranks_of_a_group_with_different_rows_fail_clearly(sp_pair):
    sp_pair.restart({"ulysses_size": 2}, False, False)
    sp_pair._rank_infos = sp_pair._fetch_rank_infos()
    with pytest.raises(Exception, match="ranks of a Ulysses group got different rows"):
        sp_pair.log_probs_each([rl_batch(2, seed=1), rl_batch(2, seed=2)])
    batch = rl_batch(3, seed=1)
    with pytest.raises(Exception, match="the same rows in another order"):
        sp_pair.log_probs_each([batch, batch.select_idxs(torch.tensor([2, 1, 0]))])
    same = sp_pair.log_probs_each([batch, batch])
    torch.testing.assert_close(same[0].batch["log_probs"], same[1].batch["log_probs"], atol=0.0, rtol=0.0)
