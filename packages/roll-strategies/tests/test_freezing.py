"""model_args.freeze_module_prefix: ROLL's prefix rule on named_parameters, on fsdp2_train (tiny model, CPU) and
on the megatron adapter's names (pure mapping, no megatron needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from roll.runtime import ConfigError
from roll.strategies import (
    ModelArgs,
)
from roll.strategies.freezing import freeze_by_prefix
from roll.strategies.megatron._freeze import megatron_frozen_names
from roll.strategies.megatron._mapping import GptLayout, MegatronMapping
from roll.strategies.testing.train import sft_batch, sft_loss, tiny_strategy

pytestmark = pytest.mark.usefixtures("isolated_process")


# --- the config field -----------------------------------------------------------------------------------------
def test_roll_comma_string_splits_into_prefixes() -> None:
    args = ModelArgs(freeze_module_prefix=" model.embed_tokens, model.layers.0 ")
    assert args.freeze_module_prefix == ["model.embed_tokens", "model.layers.0"]
    assert ModelArgs(freeze_module_prefix=["a", "b"]).freeze_module_prefix == ["a", "b"]
    assert ModelArgs(freeze_module_prefix=None).freeze_module_prefix is None
    with pytest.raises(ConfigError, match="empty prefix"):
        ModelArgs(freeze_module_prefix="a,,b")
    with pytest.raises(ConfigError, match="freeze_module_prefix and lora_rank are both set"):
        ModelArgs(freeze_module_prefix="a", lora_rank=4)


# --- the rule on a plain module -------------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(12)])
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def test_plain_string_prefix_like_roll() -> None:
    net = Net()
    frozen = freeze_by_prefix(net, ["layers.1"])
    # ROLL's name.startswith(prefix): layers.1 also covers layers.10 and layers.11
    assert frozen == [f"layers.{i}.{p}" for i in (1, 10, 11) for p in ("weight", "bias")]
    assert {n for n, p in net.named_parameters() if not p.requires_grad} == set(frozen)


def test_unmatched_prefix_names_it_and_nearby_modules() -> None:
    with pytest.raises(ConfigError, match=r"'layer\.3' matches no parameter .*nearby module names: .*layers\.3"):
        freeze_by_prefix(Net(), ["layers.0", "layer.3"])
    with pytest.raises(ConfigError, match=r"'vision_model' matches no parameter.*nearby module names: embed, layers"):
        freeze_by_prefix(Net(), ["vision_model"])
    with pytest.raises(ConfigError, match=r"'head.weight' is tied to .*freeze that one"):
        freeze_by_prefix(Net(), ["head"])
    with pytest.raises(ConfigError, match="freezes every trainable parameter"):
        freeze_by_prefix(Net(), ["embed", "layers"])
    net = Net()
    with pytest.raises(ConfigError):
        freeze_by_prefix(net, ["layers.0", "nope"])
    assert all(p.requires_grad for p in net.parameters())  # nothing frozen when a prefix is bad


# --- fsdp2_train on the tiny model ----------------------------------------------------------------------------
def frozen_strategy(model: Path, prefixes: str) -> Any:
    return tiny_strategy(model, model_args={"freeze_module_prefix": prefixes}, training_args={"learning_rate": 1e-2})


def test_fsdp2_frozen_params_do_not_change_and_are_not_in_the_optimizer(tiny_model: Path) -> None:
    prefixes = ["model.embed_tokens", "model.layers.0.", "model.norm"]
    strategy = frozen_strategy(tiny_model, ",".join(prefixes))
    named = dict(strategy.model.named_parameters())
    frozen = {n for n in named if any(n.startswith(p) for p in prefixes)}
    assert frozen and {n for n, p in named.items() if not p.requires_grad} == frozen
    in_optimizer = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
    assert {n for n, p in named.items() if id(p) in in_optimizer} == set(named) - frozen
    before = {n: p.full_tensor().clone() for n, p in named.items()}
    for _ in range(2):
        strategy.train_step(sft_batch(4, seed=0, padded=False), sft_loss, loss_mask_key="loss_mask")
    after = {n: p.full_tensor() for n, p in strategy.model.named_parameters()}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == set(named) - frozen  # every trainable parameter moved, no frozen one did
    assert all(id(p) not in strategy.optimizer.state for n, p in named.items() if n in frozen)
    # the tied lm_head is the embedding: exported unchanged too
    weights = dict(strategy.named_weights())
    torch.testing.assert_close(weights["lm_head.weight"], before["model.embed_tokens.weight"], atol=0, rtol=0)


def test_fsdp2_unknown_prefix_fails_at_load_naming_it(tiny_model: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"'model\.layer\.1' matches no parameter.*nearby module names: model\.layers"
    ):
        frozen_strategy(tiny_model, "model.layer.1")


# --- megatron names ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mapping(tiny_model: Path) -> MegatronMapping:
    from transformers import AutoConfig

    return MegatronMapping(GptLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model)))


def test_megatron_takes_megatron_core_names(mapping: MegatronMapping) -> None:
    frozen = megatron_frozen_names(mapping, ["embedding", "decoder.layers.0."])
    assert frozen == {"embedding.word_embeddings.weight"} | {
        s.megatron_name for s in mapping.specs if s.megatron_name.startswith("decoder.layers.0.")
    }


def test_megatron_takes_hf_names_of_whole_fused_params(mapping: MegatronMapping) -> None:
    mlp = megatron_frozen_names(mapping, ["model.layers.1.mlp"])
    assert mlp == {"decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc2.weight"}
    attn = megatron_frozen_names(mapping, ["model.layers.0.self_attn"])
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in attn
    assert "decoder.layers.0.input_layernorm.weight" not in attn
    # tied embeddings: the output layer is built from the embedding, so it is frozen with it
    assert mapping.layout.tie_word_embeddings
    embed = megatron_frozen_names(mapping, ["model.embed_tokens"])
    assert embed == {"embedding.word_embeddings.weight", "output_layer.weight"}


def test_megatron_rejects_part_of_a_fused_param_and_unknown_prefixes(mapping: MegatronMapping) -> None:
    with pytest.raises(ConfigError, match=r"q_proj.*fuses them with .*k_proj.*linear_qkv.*frozen whole"):
        megatron_frozen_names(mapping, ["model.layers.0.self_attn.q_proj"])
    with pytest.raises(ConfigError, match=r"'vision_model' matches no parameter \(megatron-core or HF names"):
        megatron_frozen_names(mapping, ["vision_model"])
    with pytest.raises(ConfigError, match="freezes every parameter"):
        megatron_frozen_names(mapping, ["embedding", "decoder", "output_layer"])
