"""fsdp2_train / fsdp2_infer on CPU (gloo): micro-batching, 2-rank equivalence, checkpoints, export, LoRA."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch

from roll.protocol import Dispatch, register
from roll.runtime import ConfigError
from roll.runtime.testing import ship_module_by_value
from roll.strategies import (
    StrategyArgs,
    StrategyError,
    create_strategy,
)
from roll.strategies.fsdp2._optim import lr_factor
from roll.strategies.fsdp2._weights import load_full_weights
from roll.strategies.fsdp2.config import Fsdp2Config
from roll.strategies.testing.train import (
    SftWorker,
    logits_of,
    running_cluster,
    sft_batch,
    sft_loss,
    tiny_strategy,
    tiny_worker_config,
)
from roll.strategies.weight_sync.plan import build_plan, slot_views

ship_module_by_value(__name__)

TOL = {"atol": 1e-5, "rtol": 0.0}


pytestmark = pytest.mark.usefixtures("isolated_process")


def weights(strategy) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in strategy.named_weights()}


def assert_weights_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: Any) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], **(tol or TOL), msg=lambda m, n=name: f"{n}: {m}")


# --- configuration --------------------------------------------------------------------------------------------
def test_config_validates_ranges_and_is_known_to_the_registry(tiny_model):
    assert Fsdp2Config().devices_per_worker == 1
    with pytest.raises(ConfigError, match="fsdp_size"):
        Fsdp2Config(fsdp_size=0)
    with pytest.raises(ConfigError, match="unknown field"):
        tiny_worker_config(tiny_model, strategy_config={"fsdp_sise": 2})
    with pytest.raises(ConfigError, match="param_dtype"):
        tiny_worker_config(tiny_model, strategy_config={"param_dtype": "fp8"})


def test_lr_schedule_warms_up_and_decays_to_the_floor():
    cosine = {"kind": "cosine", "warmup": 2, "total": 10, "min_ratio": 0.1}
    assert [lr_factor(s, **cosine) for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, **cosine) == pytest.approx(1.0)
    assert lr_factor(6, **cosine) == pytest.approx(0.55)
    assert lr_factor(10, **cosine) == pytest.approx(0.1) == lr_factor(50, **cosine)
    assert lr_factor(6, kind="linear", warmup=2, total=10, min_ratio=0.0) == pytest.approx(0.5)
    assert lr_factor(7, kind="constant", warmup=0, total=None, min_ratio=0.0) == 1.0


# --- single rank, in process -----------------------------------------------------------------------------------
def test_training_decreases_the_loss_and_micro_batching_does_not_change_the_step(tiny_model):
    batch = sft_batch(4, seed=1)
    strategy = tiny_strategy(tiny_model, training_args={"per_device_train_batch_size": 4, "learning_rate": 1e-3})
    assert strategy.rank_info.dp_size == 1 and strategy.rank_info.tp_size == 1
    losses = [strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")["loss"] for _ in range(4)]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.2, losses

    results = {}
    for micro_size, checkpointing in ((1, False), (4, False), (4, True)):
        model_args = {"gradient_checkpointing": checkpointing}
        strategy = tiny_strategy(
            tiny_model, model_args=model_args, training_args={"per_device_train_batch_size": micro_size}
        )
        metrics = strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")
        results[micro_size, checkpointing] = (metrics, weights(strategy))
    (m1, w1), (m4, w4), (m_gc, w_gc) = results.values()
    assert m_gc["loss"] == pytest.approx(m4["loss"], abs=1e-6)
    assert_weights_close(w_gc, w4)
    assert m1["loss"] == pytest.approx(m4["loss"], abs=1e-5)
    assert m1["grad_norm"] == pytest.approx(m4["grad_norm"], rel=1e-5)
    assert m1["lr"] == m4["lr"] == 1e-4
    assert m1["tokens"] == pytest.approx(batch.batch["loss_mask"].sum().item() / 4)  # averaged over micro-batches
    assert_weights_close(w1, w4)


def test_named_weights_are_the_full_hf_state_including_the_tied_lm_head(tiny_model):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert reference.config.tie_word_embeddings
    expected = dict(reference.state_dict())
    expected.setdefault("lm_head.weight", reference.get_input_embeddings().weight)
    got = weights(tiny_strategy(tiny_model))
    assert "lm_head.weight" in got
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor, expected[name]), name
    assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])


def synced_weights(writer) -> dict[str, torch.Tensor]:
    """What one weight sync writes (a strategy's weight writer's local writes into a host slot), by name."""
    plan = build_plan(writer.specs, 64 << 10)
    slot = torch.zeros(plan.slot_bytes, dtype=torch.uint8)
    out = {}
    for bucket, views in zip(plan.buckets, slot_views(plan, slot)):
        writer.write(bucket.start, bucket.stop, [t for _, t in views], local=True)
        out.update({name: t.clone() for name, t in views})  # every bucket reuses the slot
    return out


def test_a_weight_sync_writes_the_current_weights_after_training_and_after_their_storage_moved(tiny_model):
    strategy = tiny_strategy(tiny_model, training_args={"learning_rate": 1e-3})
    writer = strategy.weight_writer()  # one per channel, reused by every sync
    assert len(writer.specs) > 2 and writer.writes_shards
    assert_weights_close(synced_weights(writer), weights(strategy), atol=0.0, rtol=0.0)
    strategy.train_step(sft_batch(4, seed=1), sft_loss, loss_mask_key="loss_mask")
    assert_weights_close(synced_weights(writer), weights(strategy), atol=0.0, rtol=0.0)
    # Offloading and reloading on a GPU gives every parameter new storage: a sync must read the new tensors.
    with torch.no_grad():
        for param in strategy.model.parameters():
            param.data = param.data + 0.5
    assert_weights_close(synced_weights(writer), weights(strategy), atol=0.0, rtol=0.0)


def test_a_model_whose_state_dict_renames_its_weights_is_synced_under_those_names(tiny_model):
    from roll.strategies.fsdp2._writer import Fsdp2WeightWriter

    strategy = tiny_strategy(tiny_model)
    expected = {f"renamed.{name}": tensor for name, tensor in weights(strategy).items()}

    def rename(module, state_dict, prefix, local_metadata):
        for key in list(state_dict):
            state_dict[f"renamed.{key}"] = state_dict.pop(key)

    strategy.model._register_state_dict_hook(rename)
    writer = Fsdp2WeightWriter(strategy.model, None)
    # The tied head is also sent under its plain name when the state dict lacks that name (as it does here).
    expected["lm_head.weight"] = expected["renamed.model.embed_tokens.weight"]
    assert [spec.name for spec in writer.specs][-1] == "lm_head.weight"
    assert_weights_close(synced_weights(writer), expected, atol=0.0, rtol=0.0)


def test_checkpoint_resumes_bit_exactly(tiny_model, tmp_path):
    training = {
        "lr_scheduler_type": "cosine",
        "warmup_steps": 1,
        "max_steps": 5,
        "weight_decay": 0.1,
        "max_grad_norm": 0.5,
    }
    batches = [sft_batch(4, seed=s) for s in (1, 2, 3)]
    first = tiny_strategy(tiny_model, training_args=training)
    for batch in batches[:2]:
        first.train_step(batch, sft_loss, loss_mask_key="loss_mask")
    first.save_checkpoint(str(tmp_path / "ckpt"))
    saved_rng = torch.get_rng_state()
    expected_metrics = first.train_step(batches[2], sft_loss, loss_mask_key="loss_mask")
    expected = weights(first)

    resumed = tiny_strategy(tiny_model, training_args=training)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert torch.equal(torch.get_rng_state(), saved_rng)
    metrics = resumed.train_step(batches[2], sft_loss, loss_mask_key="loss_mask")
    assert metrics == expected_metrics
    got = weights(resumed)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    with pytest.raises(StrategyError, match="not an fsdp2 checkpoint"):
        resumed.load_checkpoint(str(tmp_path))


def test_learning_rate_changes_mid_run_keeping_the_schedule_and_adam_state(tiny_model, tmp_path):
    training = {"learning_rate": 1e-3, "lr_scheduler_type": "cosine", "warmup_steps": 2, "max_steps": 6}
    schedule = {"kind": "cosine", "warmup": 2, "total": 6, "min_ratio": 0.0}
    batch = sft_batch(4, seed=1)
    strategy = tiny_strategy(tiny_model, training_args=training)
    assert strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")["lr"] == pytest.approx(1e-3 * 0.5)
    moments = {id(p): state["exp_avg_sq"].clone() for p, state in strategy.optimizer.state.items()}
    strategy.set_learning_rate(1e-4)  # e.g. a warm-up at 1e-3, then RL at 1e-4
    lrs = [strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-4 * lr_factor(step, **schedule) for step in (1, 2, 3)])
    for param, state in strategy.optimizer.state.items():  # Adam's moments and step count went on
        assert int(state["step"]) == 4 and not torch.equal(state["exp_avg_sq"], moments[id(param)])
    strategy.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = tiny_strategy(tiny_model, training_args=training)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))  # the new base rate is part of the saved schedule
    expected = 1e-4 * lr_factor(4, **schedule)
    assert resumed.train_step(batch, sft_loss, loss_mask_key="loss_mask")["lr"] == pytest.approx(expected)
    with pytest.raises(ConfigError, match="positive number"):
        strategy.set_learning_rate(float("nan"))


def test_export_hf_loads_in_transformers_with_the_same_logits(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    strategy = tiny_strategy(tiny_model)
    strategy.train_step(sft_batch(4, seed=1), sft_loss, loss_mask_key="loss_mask")
    strategy.export_hf(str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").pad_token == "<|pad|>"

    batch = sft_batch(3, seed=5)
    ours = strategy.forward_step(batch, logits_of)["logits"]
    mask = batch.batch["attention_mask"]
    with torch.no_grad():
        theirs = exported(
            input_ids=batch.batch["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    valid = mask.bool()
    torch.testing.assert_close(ours[valid], theirs[valid], **TOL)


def test_lora_trains_only_adapters_and_exports_merged_base_weights(tiny_model, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    lora = {"lora_rank": 4, "lora_alpha": 8}
    strategy = tiny_strategy(tiny_model, model_args=lora, training_args={"learning_rate": 1e-2})
    before = {n: p.full_tensor().clone() for n, p in strategy.model.named_parameters()}
    batch = sft_batch(4, seed=1)
    losses = [strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.1, losses
    after = {n: p.full_tensor() for n, p in strategy.model.named_parameters()}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".lora_A." in n or ".lora_B." in n for n in changed)
    assert any(".lora_B." in n for n in changed)

    merged = weights(strategy)
    strategy.save_checkpoint(str(tmp_path / "lora"))
    resumed = tiny_strategy(tiny_model, model_args=lora)
    resumed.load_checkpoint(str(tmp_path / "lora"))
    assert all(torch.equal(tensor, merged[name]) for name, tensor in resumed.named_weights())
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert set(merged) == set(base.state_dict()) | {"lm_head.weight"}
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base.model.layers[0].self_attn.q_proj.weight
    )
    assert torch.equal(merged["model.norm.weight"], base.model.norm.weight)
    # The merged weights compute what the adapted model computes.
    base.load_state_dict(merged)
    eval_batch = sft_batch(2, seed=7)
    mask = eval_batch.batch["attention_mask"]
    with torch.no_grad():
        plain = base(input_ids=eval_batch.batch["input_ids"], attention_mask=mask).logits
    adapted = strategy.forward_step(eval_batch, logits_of)["logits"]
    torch.testing.assert_close(adapted[mask.bool()], plain[mask.bool()], atol=1e-4, rtol=0)


def _value_loss(micro, values, scale):
    """Squared error of every position's value against 1 (a stand-in critic loss)."""
    mask = micro.batch["loss_mask"].to(values.device).float()
    loss = (((values[..., 0] - 1.0) ** 2) * mask).sum() / scale.num_tokens
    return loss, {}


def test_lora_modules_to_save_train_in_full_and_a_lora_critic_trains_its_value_head(tiny_model, tmp_path):
    """``lora_modules_to_save`` (ROLL's additional_target) train beside the adapters under their own names, so the
    merged export carries them; a PPO critic with LoRA trains its value head too (before, peft's causal-LM wrapper
    refused the value model: "no attribute 'prepare_inputs_for_generation'")."""
    pytest.importorskip("peft")
    lora = {"lora_rank": 4, "lora_alpha": 8, "lora_modules_to_save": "model.norm"}
    strategy = tiny_strategy(tiny_model, model_args=lora, training_args={"learning_rate": 1e-2})
    before = {n: p.full_tensor().clone() for n, p in strategy.model.named_parameters()}
    for _ in range(2):
        strategy.train_step(sft_batch(4, seed=1), sft_loss, loss_mask_key="loss_mask")
    after = {n: p.full_tensor() for n, p in strategy.model.named_parameters()}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert "base_model.model.model.norm.weight" in changed
    assert all(".lora_" in n or n == "base_model.model.model.norm.weight" for n in changed)
    merged = weights(strategy)
    assert not torch.equal(merged["model.norm.weight"], before["base_model.model.model.norm.weight"])
    strategy.save_checkpoint(str(tmp_path / "lora"))
    resumed = tiny_strategy(tiny_model, model_args=lora)
    resumed.load_checkpoint(str(tmp_path / "lora"))
    assert torch.equal(dict(resumed.named_weights())["model.norm.weight"], merged["model.norm.weight"])
    with pytest.raises(ConfigError, match="lora_modules_to_save names 'no_such_norm', which is no module"):
        tiny_strategy(tiny_model, model_args={**lora, "lora_modules_to_save": ["no_such_norm"]})
    with pytest.raises(ConfigError, match="lora_modules_to_save .* is set but lora_rank is 0"):
        tiny_strategy(tiny_model, model_args={"lora_modules_to_save": ["lm_head"]})

    critic_args = {"lora_rank": 4, "lora_alpha": 8, "model_head": "value"}
    critic = tiny_strategy(tiny_model, name="critic", model_args=critic_args, training_args={"learning_rate": 1e-2})
    head = {n: p.full_tensor().clone() for n, p in critic.model.named_parameters() if ".score." in n}
    assert head and all(p.requires_grad for n, p in critic.model.named_parameters() if ".score." in n)
    batch = sft_batch(4, seed=1)
    losses = [critic.train_step(batch, _value_loss, loss_mask_key="loss_mask")["loss"] for _ in range(4)]
    assert losses[-1] < losses[0], losses
    moved = {
        n for n, p in critic.model.named_parameters() if ".score." in n and not torch.equal(p.full_tensor(), head[n])
    }
    assert moved == set(head)


def test_share_metrics_add_up_over_micro_batches_and_others_are_averaged(tiny_model):
    """A loss function's metric named with SHARE is a share of the mini-batch total like the loss: the strategy sums
    it over micro-batches (and ranks). Before, every metric was averaged, so a policy or distillation loss term read
    1/n of its value with n micro-batches (the summed ``loss`` beside it was right)."""
    from roll.strategies import SHARE

    def loss_with_metrics(micro, logits, scale):
        loss, _ = sft_loss(micro, logits, scale)
        return loss, {f"ce{SHARE}": float(loss.detach()), "rows": float(len(micro))}

    strategy = tiny_strategy(tiny_model)  # 2 rows per micro-batch: 6 rows are 3 micro-batches
    out = strategy.train_step(sft_batch(6, seed=2), loss_with_metrics, loss_mask_key="loss_mask")
    assert out["ce"] == pytest.approx(out["loss"], rel=1e-6) and f"ce{SHARE}" not in out
    assert out["rows"] == 2.0  # a per-micro-batch value: the mean


def test_infer_strategy_forwards_and_receives_weights(tiny_model):
    trainer = tiny_strategy(tiny_model)
    reference = tiny_strategy(tiny_model, strategy="fsdp2_infer", infer_batch_size=2)
    assert not any(p.requires_grad for p in reference.model.parameters())
    batch = sft_batch(3, seed=4)
    before = reference.forward_step(batch, logits_of)["logits"]
    torch.testing.assert_close(before, trainer.forward_step(batch, logits_of)["logits"], **TOL)

    trainer.train_step(sft_batch(4, seed=1), sft_loss, loss_mask_key="loss_mask")
    reference.update_weights(trainer.named_weights())
    after = reference.forward_step(batch, logits_of)["logits"]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, trainer.forward_step(batch, logits_of)["logits"], **TOL)
    with pytest.raises(StrategyError, match="does not have"):
        reference.update_weights([("model.missing.weight", torch.zeros(1))])


def test_bf16_compute_keeps_float32_masters_and_syncs_bf16_weights(tiny_model):
    strategy = tiny_strategy(
        tiny_model, strategy_config={"param_dtype": "bfloat16"}, training_args={"learning_rate": 1e-3}
    )
    batch = sft_batch(4, seed=1)
    losses = [strategy.train_step(batch, sft_loss, loss_mask_key="loss_mask")["loss"] for _ in range(3)]
    assert losses[-1] < losses[0], losses
    assert all(p.dtype == torch.float32 for p in strategy.model.parameters())
    synced = dict(strategy.named_weights())
    assert {t.dtype for t in synced.values()} == {torch.bfloat16}
    strategy.offload_states()  # nothing to move on the CPU, but it must work
    strategy.load_states()
    assert strategy.forward_step(batch, logits_of)["logits"].dtype == torch.float32


def test_train_step_explains_a_missing_loss_mask_and_an_empty_batch(tiny_model):
    strategy = tiny_strategy(tiny_model)
    batch = sft_batch(2, seed=1)
    with pytest.raises(StrategyError, match="response_mask"):
        strategy.train_step(batch, sft_loss, loss_mask_key="response_mask")
    with pytest.raises(StrategyError, match="no rows"):
        strategy.train_step(sft_batch(2, seed=1)[:0], sft_loss, loss_mask_key="loss_mask")
    assert strategy.forward_step(sft_batch(2, seed=1)[:0], logits_of) == {}


# --- two ranks on Ray ------------------------------------------------------------------------------------------
class Fsdp2TestWorker(SftWorker):
    """A training role with the registered calls the cluster test needs."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL_ONE)
    def full_weights(self) -> dict[str, torch.Tensor] | None:
        full = {name: tensor.clone() for name, tensor in self.strategy.named_weights()}
        return full if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, named: dict[str, torch.Tensor]) -> int:
        return load_full_weights(self.strategy.model, named.items())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restart(self, strategy_config: dict[str, Any] | None = None) -> None:
        """Replace the strategy with a fresh one (optionally with other backend settings)."""
        if strategy_config is not None:
            args = StrategyArgs(strategy_name="fsdp2_train", strategy_config=strategy_config)
            self.worker_config = self.worker_config.model_copy(update={"strategy_args": args})
        self.strategy.shutdown()
        self.strategy = create_strategy(self)
        self.strategy.initialize()


@pytest.fixture(scope="module")
def two_ranks(tiny_model, resources):
    """A 2-worker fsdp2_train role (gloo); each test restarts its strategy with the settings it needs."""
    config = tiny_worker_config(tiny_model, world_size=2, system_envs={"OMP_NUM_THREADS": "1"}, infer_batch_size=1)
    with running_cluster(f"fsdp2-{uuid.uuid4().hex[:8]}", Fsdp2TestWorker, resources, config) as cluster:
        yield cluster


def test_two_ranks_match_one_rank(two_ranks, tiny_model):
    """FSDP2 on 2 ranks (two Ray workers, gloo) gives the same losses and final weights as 1 rank."""
    batches = [sft_batch(8, seed=s) for s in (11, 12, 13)]
    probe = sft_batch(3, seed=21)
    reference = tiny_strategy(tiny_model)
    probe_logits = reference.forward_step(probe, logits_of)["logits"]
    ref_metrics = [reference.train_step(batch, sft_loss, loss_mask_key="loss_mask") for batch in batches]

    two_ranks.restart({})
    assert [info.dp_size for info in two_ranks.rank_infos] == [2, 2]
    # Sharded forward with uneven shards (2 and 1 rows, one row per micro-batch) equals the 1-rank forward.
    torch.testing.assert_close(two_ranks.logits(probe).batch["logits"], probe_logits, **TOL)
    for step, (batch, expected) in enumerate(zip(batches, ref_metrics)):
        per_rank = two_ranks.train(batch)
        assert per_rank[0]["loss"] == per_rank[1]["loss"], step
        assert per_rank[0]["loss"] == pytest.approx(expected["loss"], abs=1e-5), step
        # a share metric is summed over both ranks' micro-batches, like the loss
        assert per_rank[0]["nll"] == per_rank[1]["nll"] == pytest.approx(expected["nll"], abs=1e-5), step
        assert per_rank[0]["nll"] == pytest.approx(per_rank[0]["loss"], abs=1e-6), step
        assert per_rank[0]["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5), step
    assert_weights_close(two_ranks.full_weights(), weights(reference))


def test_two_ranks_resume_from_a_sharded_checkpoint_exactly(two_ranks, tmp_path):
    batches = [sft_batch(8, seed=s) for s in (11, 12, 13)]
    two_ranks.restart({})
    two_ranks.train(batches[0])
    two_ranks.train(batches[1])
    two_ranks.save_checkpoint(str(tmp_path / "ckpt"))
    expected_metrics = two_ranks.train(batches[2])
    expected = two_ranks.full_weights()

    two_ranks.restart({})
    two_ranks.load_checkpoint(str(tmp_path / "ckpt"))
    assert two_ranks.train(batches[2]) == expected_metrics
    resumed = two_ranks.full_weights()
    assert all(torch.equal(resumed[name], expected[name]) for name in expected)

    # Full tensors in, every rank cuts its own shard: gathering them again gives back exactly what went in.
    new = {name: tensor + 0.5 for name, tensor in expected.items()}
    assert two_ranks.load_weights(new) == [len(new)] * 2
    assert all(torch.equal(tensor, new[name]) for name, tensor in two_ranks.full_weights().items())


def test_hsdp_with_uneven_shards_matches_one_rank(two_ranks, tiny_model):
    """2 replicas x 1 shard; 5 rows split 3 + 2, so rank 1 repeats a micro-batch at weight 0."""
    batches = [sft_batch(8, seed=11), sft_batch(5, seed=14)]
    reference = tiny_strategy(tiny_model)
    ref_metrics = [reference.train_step(batch, sft_loss, loss_mask_key="loss_mask") for batch in batches]
    two_ranks.restart({"fsdp_size": 1})
    for batch, expected in zip(batches, ref_metrics):
        assert two_ranks.train(batch)[0]["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert_weights_close(two_ranks.full_weights(), weights(reference))
