"""megatron_train / megatron_infer: config, HF <-> Megatron weight mapping, batch helpers, import guards.

Everything here runs without megatron-core except the tests marked ``gpu`` (real training on a GPU).
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from roll.protocol import DataProto
from roll.runtime import ConfigError, MissingExtraError
from roll.strategies import STRATEGIES, StrategyArgs, StrategyError, StrategyWorkerConfig, TrainingArgs
from roll.strategies.megatron import MegatronConfig, check_world_size
from roll.strategies.megatron._batching import (
    count_loss_tokens,
    left_shifts,
    loss_scale,
    pad_micro_batches,
    prepare_inputs,
    restore_logits,
    sequence_multiple,
    zigzag_merge,
    zigzag_split,
)
from roll.strategies.megatron._hf_io import HfCheckpointReader, write_hf_folder
from roll.strategies.megatron._mapping import (
    EMBEDDING,
    OUTPUT_LAYER,
    GptLayout,
    HfAssembler,
    MegatronMapping,
    to_global_name,
    to_local_name,
)
from roll.strategies.megatron._sharding import gather_tp, shard_tp
from roll.strategies.megatron._translate import (
    check_model_supported,
    check_parallel_fit,
    gpt_model_kwargs,
    optimizer_config_kwargs,
    padded_vocab_size,
    rank_info_from_parallel_state,
    resolve_params_dtype,
    rope_settings,
    scheduler_kwargs,
    transformer_config_kwargs,
)
from roll.strategies.registry import create_strategy, validate_strategy_config
from roll.strategies.testing import make_tiny_causal_lm

HAS_MEGATRON = importlib.util.find_spec("megatron") is not None


# --- fixtures -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def micro_model(tmp_path_factory) -> Path:
    """4 layers, 4 query heads in 2 groups (TP=2 possible), untied lm_head."""
    return make_tiny_causal_lm(tmp_path_factory.mktemp("mg") / "micro", preset="micro", tie_word_embeddings=False)


def hf_state(path: Path) -> tuple[dict[str, torch.Tensor], object]:
    from transformers import AutoConfig

    reader = HfCheckpointReader(path)
    return {name: reader.get(name) for name in reader.names}, AutoConfig.from_pretrained(path)


# --- config ---------------------------------------------------------------------------------------------------
def test_config_defaults_use_one_device_per_worker():
    config = MegatronConfig()
    assert config.devices_per_worker == 1
    assert config.model_parallel_size == 1
    assert config.use_distributed_optimizer and config.transformer_impl == "local"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sequence_parallel": True}, "tensor_model_parallel_size > 1"),
        ({"sequence_parallel": True, "tensor_model_parallel_size": 2}, "transformer_engine"),
        ({"virtual_pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size > 1"),
        ({"context_parallel_size": 2}, "transformer_impl='transformer_engine'"),
        ({"bf16": True, "fp16": True}, "choose one"),
        ({"recompute_granularity": "full"}, "recompute_method"),
        ({"recompute_method": "uniform"}, "apply only to recompute_granularity='full'"),
        ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size"),
        ({"tensor_parallel": 2}, "unknown field"),
    ],
)
def test_config_rejects_inconsistent_settings(settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MegatronConfig(**settings)


def test_config_accepts_consistent_parallel_settings():
    config = MegatronConfig(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        context_parallel_size=2,
        sequence_parallel=True,
        transformer_impl="transformer_engine",
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    assert config.model_parallel_size == 8


def test_world_size_divisibility_names_the_fields():
    config = MegatronConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert check_world_size(config, 8) == 2
    with pytest.raises(ConfigError) as info:
        check_world_size(config, 6)
    text = str(info.value)
    assert "tensor_model_parallel_size (2)" in text and "pipeline_model_parallel_size (2)" in text
    with pytest.raises(ConfigError, match="expert_model_parallel_size"):
        check_world_size(MegatronConfig(expert_model_parallel_size=3), 4)


def test_role_config_gets_one_worker_per_gpu():
    role = StrategyWorkerConfig(
        device_mapping="list(range(0, 4))",
        strategy_args=StrategyArgs(strategy_name="megatron_train", strategy_config={"tensor_model_parallel_size": 2}),
    )
    assert role.num_gpus_per_worker == 1 and role.world_size == 4
    config = validate_strategy_config("megatron_infer", {"pipeline_model_parallel_size": 2})
    assert isinstance(config, MegatronConfig)
    with pytest.raises(ConfigError, match="megatron_train"):
        validate_strategy_config("megatron_train", {"tp": 2})


# --- import guards --------------------------------------------------------------------------------------------
def test_pure_modules_do_not_import_megatron():
    code = (
        "import sys\n"
        "import roll.strategies.megatron, roll.strategies.megatron.config, roll.strategies.megatron._mapping\n"
        "import roll.strategies.megatron._sharding, roll.strategies.megatron._translate\n"
        "import roll.strategies.megatron._batching, roll.strategies.megatron._hf_io\n"
        "print(sorted(m for m in sys.modules if m == 'megatron' or m.startswith('megatron.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _fake_worker(strategy_name: str) -> SimpleNamespace:
    config = StrategyWorkerConfig(name="actor", strategy_args=StrategyArgs(strategy_name=strategy_name))
    return SimpleNamespace(worker_config=config, rank=0, world_size=1, local_rank=0)


@pytest.mark.skipif(HAS_MEGATRON, reason="megatron-core is installed")
@pytest.mark.parametrize("name", ["megatron_train", "megatron_infer"])
def test_selecting_megatron_without_it_names_the_extra(name):
    with pytest.raises(MissingExtraError) as info:
        STRATEGIES.get(name)
    assert "pip install 'roll-strategies[megatron]'" in str(info.value)
    with pytest.raises(MissingExtraError, match=r"pip install 'roll-strategies\[megatron\]'"):
        create_strategy(_fake_worker(name))


# --- HF <-> Megatron mapping -----------------------------------------------------------------------------------
def test_round_trip_is_exact_for_tied_gqa_model(tiny_model):
    hf, hf_config = hf_state(tiny_model)
    layout = GptLayout.from_hf_config(hf_config)
    assert layout.num_query_groups < layout.num_attention_heads and layout.tie_word_embeddings and layout.qkv_bias
    mapping = MegatronMapping(layout)
    hf.pop("lm_head.weight", None)  # a tied checkpoint may or may not store it
    assert sorted(mapping.hf_names) == sorted(hf)
    megatron = mapping.hf_to_megatron(hf)
    assert {"decoder.layers.0.input_layernorm.weight", "decoder.layers.1.mlp.linear_fc1.weight"} <= set(megatron)
    qkv = megatron["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == ((layout.num_attention_heads + 2 * layout.num_query_groups) * layout.head_dim, 128)
    back = mapping.megatron_to_hf(megatron)
    assert sorted(back) == sorted(hf)
    assert all(torch.equal(back[name], hf[name]) for name in hf)


def test_round_trip_pads_and_trims_the_vocabulary(micro_model):
    hf, hf_config = hf_state(micro_model)
    padded = hf_config.vocab_size + 64
    mapping = MegatronMapping(GptLayout.from_hf_config(hf_config, padded_vocab_size=padded))
    megatron = mapping.hf_to_megatron(hf)
    for name in (EMBEDDING, OUTPUT_LAYER):
        assert megatron[name].shape[0] == padded
        assert not megatron[name][hf_config.vocab_size :].any()
    assert torch.equal(megatron[OUTPUT_LAYER][: hf_config.vocab_size], hf["lm_head.weight"])
    back = mapping.megatron_to_hf(megatron)
    assert sorted(back) == sorted(hf) and all(torch.equal(back[name], hf[name]) for name in hf)


def test_tied_output_layer_is_loaded_from_the_embedding_but_not_exported(tiny_model):
    hf, hf_config = hf_state(tiny_model)
    mapping = MegatronMapping(GptLayout.from_hf_config(hf_config))
    output = mapping.to_megatron(OUTPUT_LAYER, hf.__getitem__)  # the last pipeline stage's copy
    assert torch.equal(output, hf["model.embed_tokens.weight"])
    assert mapping.to_hf(OUTPUT_LAYER, output) == []


def _random_hf_state(config) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_other_architectures_round_trip(arch):
    from transformers import LlamaConfig, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[arch]
    config = cls(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    state = _random_hf_state(config)
    layout = GptLayout.from_hf_config(config, spec="transformer_engine")
    mapping = MegatronMapping(layout)
    names = {spec.megatron_name for spec in mapping.specs}
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in names  # TE spec fuses the norms
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in names
    assert ("decoder.layers.0.self_attention.q_layernorm.weight" in names) == (arch == "qwen3")
    assert "decoder.layers.0.self_attention.linear_qkv.bias" not in names
    assert sorted(mapping.hf_names) == sorted(state)
    back = mapping.megatron_to_hf(mapping.hf_to_megatron(state))
    assert all(torch.equal(back[name], state[name]) for name in state)


def test_tp2_shard_then_gather_is_exact(micro_model):
    hf, hf_config = hf_state(micro_model)
    layout = GptLayout.from_hf_config(hf_config, padded_vocab_size=padded_vocab_size(hf_config.vocab_size, 128, 2))
    mapping = MegatronMapping(layout)
    megatron = mapping.hf_to_megatron(hf)
    for spec in mapping.specs:
        full = megatron[spec.megatron_name]
        shards = [shard_tp(spec, full, rank, 2) for rank in range(2)]
        assert torch.equal(gather_tp(spec, shards), full), spec.megatron_name
        if spec.tp_dim is not None:
            assert shards[0].shape[spec.tp_dim] * 2 == full.shape[spec.tp_dim]
    d, groups, per = layout.head_dim, layout.num_query_groups, layout.heads_per_group
    qkv = mapping.spec("decoder.layers.0.self_attention.linear_qkv.weight")
    assert shard_tp(qkv, megatron[qkv.megatron_name], 1, 2).shape[0] == (groups // 2) * (per + 2) * d
    with pytest.raises(ValueError, match="not divisible"):
        shard_tp(qkv, megatron[qkv.megatron_name], 0, 3)


def test_fused_qkv_gives_the_same_projections_per_tp_rank(micro_model):
    """Megatron's split of x @ linear_qkv (whole, and per TP shard) reproduces HF's q/k/v projections."""
    hf, hf_config = hf_state(micro_model)
    layout = GptLayout.from_hf_config(hf_config)
    mapping = MegatronMapping(layout)
    name = "decoder.layers.1.self_attention.linear_qkv"
    weight, bias = (
        mapping.to_megatron(name + ".weight", hf.__getitem__),
        mapping.to_megatron(name + ".bias", hf.__getitem__),
    )
    x = torch.randn(5, layout.hidden_size, generator=torch.Generator().manual_seed(1))
    d, per = layout.head_dim, layout.heads_per_group
    prefix = "model.layers.1.self_attn."
    expected = {p: x @ hf[f"{prefix}{p}_proj.weight"].T + hf[f"{prefix}{p}_proj.bias"] for p in "qkv"}
    expected = {p: t.view(5, -1, d) for p, t in expected.items()}  # (tokens, heads, head_dim)
    for tp in (1, 2):
        for rank in range(tp):
            w = shard_tp(mapping.spec(name + ".weight"), weight, rank, tp)
            b = shard_tp(mapping.spec(name + ".bias"), bias, rank, tp)
            # What SelfAttention.get_query_key_value_tensors does with its local output.
            mixed = (x @ w.T + b).view(5, layout.num_query_groups // tp, (per + 2) * d)
            q, k, v = torch.split(mixed, [per * d, d, d], dim=-1)
            heads, groups = (
                slice(rank * q.shape[1] * per, (rank + 1) * q.shape[1] * per),
                slice(rank * k.shape[1], (rank + 1) * k.shape[1]),
            )
            torch.testing.assert_close(q.reshape(5, -1, d), expected["q"][:, heads], rtol=0, atol=1e-5)
            torch.testing.assert_close(k, expected["k"][:, groups], rtol=0, atol=1e-5)
            torch.testing.assert_close(v, expected["v"][:, groups], rtol=0, atol=1e-5)


def test_tp_sharded_mlp_matches_hf(micro_model):
    """Column-parallel fc1 ([gate; up] per rank) and row-parallel fc2 sum to HF's SwiGLU MLP."""
    hf, hf_config = hf_state(micro_model)
    mapping = MegatronMapping(GptLayout.from_hf_config(hf_config))
    fc1, fc2 = "decoder.layers.2.mlp.linear_fc1.weight", "decoder.layers.2.mlp.linear_fc2.weight"
    full1, full2 = mapping.to_megatron(fc1, hf.__getitem__), mapping.to_megatron(fc2, hf.__getitem__)
    x = torch.randn(3, hf_config.hidden_size, generator=torch.Generator().manual_seed(2))
    p = "model.layers.2.mlp."
    expected = (F.silu(x @ hf[p + "gate_proj.weight"].T) * (x @ hf[p + "up_proj.weight"].T)) @ hf[
        p + "down_proj.weight"
    ].T
    total = torch.zeros_like(expected)
    for rank in range(2):
        gate, up = torch.chunk(x @ shard_tp(mapping.spec(fc1), full1, rank, 2).T, 2, dim=-1)
        total += (F.silu(gate) * up) @ shard_tp(mapping.spec(fc2), full2, rank, 2).T
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


def _megatron_layout_logits(weights: dict[str, torch.Tensor], layout: GptLayout, hf_config, ids: torch.Tensor):
    """A from-scratch GPT forward that reads only megatron names/layouts (local spec), for checking the mapping."""
    d, per, groups = layout.head_dim, layout.heads_per_group, layout.num_query_groups
    eps = hf_config.rms_norm_eps
    theta, _, _ = rope_settings(hf_config)
    b, s = ids.shape
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    h = weights[EMBEDDING][ids]
    causal = torch.full((s, s), float("-inf")).triu(1)
    for i in range(layout.num_layers):
        p = f"decoder.layers.{i}."
        mixed = norm(h, weights[p + "input_layernorm.weight"]) @ weights[p + "self_attention.linear_qkv.weight"].T
        mixed = (mixed + weights[p + "self_attention.linear_qkv.bias"]).view(b, s, groups, (per + 2) * d)
        q, k, v = torch.split(mixed, [per * d, d, d], dim=-1)
        q, k = rope(q.reshape(b, s, groups * per, d)), rope(k)
        k, v = k.repeat_interleave(per, dim=2), v.repeat_interleave(per, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / d**0.5 + causal
        attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, s, -1)
        h = h + attn @ weights[p + "self_attention.linear_proj.weight"].T
        gate, up = torch.chunk(
            norm(h, weights[p + "pre_mlp_layernorm.weight"]) @ weights[p + "mlp.linear_fc1.weight"].T, 2, -1
        )
        h = h + (F.silu(gate) * up) @ weights[p + "mlp.linear_fc2.weight"].T
    h = norm(h, weights["decoder.final_layernorm.weight"])
    output = weights[EMBEDDING] if layout.tie_word_embeddings else weights[OUTPUT_LAYER]
    return (h @ output.T)[..., : layout.vocab_size]


@pytest.mark.parametrize("which", ["tiny_model", "micro_model"])
def test_megatron_layout_forward_matches_hf_logits(which, request):
    from transformers import AutoModelForCausalLM

    path = request.getfixturevalue(which)
    hf, hf_config = hf_state(path)
    layout = GptLayout.from_hf_config(hf_config, padded_vocab_size=padded_vocab_size(hf_config.vocab_size, 96, 1))
    weights = MegatronMapping(layout).hf_to_megatron(hf)
    ids = torch.randint(0, hf_config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(ids).logits
        got = _megatron_layout_logits(weights, layout, hf_config, ids)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_layer_numbers_translate_between_chunks_and_the_model():
    numbers = [2, 3]  # a pipeline stage holding layers 2 and 3
    assert to_global_name("decoder.layers.1.mlp.linear_fc2.weight", numbers) == "decoder.layers.3.mlp.linear_fc2.weight"
    assert to_global_name(EMBEDDING, numbers) == EMBEDDING
    assert (
        to_local_name("decoder.layers.2.input_layernorm.weight", numbers) == "decoder.layers.0.input_layernorm.weight"
    )
    assert to_local_name("decoder.layers.0.input_layernorm.weight", numbers) is None


def test_assembler_builds_fused_parameters_from_shuffled_buckets(micro_model):
    hf, hf_config = hf_state(micro_model)
    mapping = MegatronMapping(GptLayout.from_hf_config(hf_config))
    expected = mapping.hf_to_megatron(hf)
    items = [*hf.items(), ("model.rotary_emb.inv_freq", torch.zeros(2))]
    random.Random(0).shuffle(items)
    assembler, built = HfAssembler(mapping), {}
    for name, tensor in items:
        built.update(assembler.add(name, tensor))
    assert assembler.pending == [] and assembler.unknown == ["model.rotary_emb.inv_freq"]
    assert sorted(built) == sorted(expected) and all(torch.equal(built[n], expected[n]) for n in expected)
    # A pipeline stage that holds only layer 3 builds (and keeps) only what it needs.
    wanted = {spec.megatron_name for spec in mapping.specs if spec.megatron_name.startswith("decoder.layers.3.")}
    stage, built = HfAssembler(mapping, wanted=wanted), {}
    for name, tensor in items:
        built.update(stage.add(name, tensor))
    assert set(built) == wanted and stage.pending == []
    partial = HfAssembler(mapping)
    partial.add("model.layers.0.self_attn.q_proj.weight", hf["model.layers.0.self_attn.q_proj.weight"])
    assert partial.pending == ["model.layers.0.self_attn.q_proj.weight"]


def test_assembler_keeps_copies_of_what_it_holds_past_a_bucket(micro_model):
    """Weight-sync buckets are views of a slot that is overwritten after each update_weights call."""
    hf, hf_config = hf_state(micro_model)
    mapping = MegatronMapping(GptLayout.from_hf_config(hf_config))
    expected = mapping.hf_to_megatron(hf)
    assembler, built = HfAssembler(mapping), {}
    items = list(hf.items())
    for start in range(0, len(items), 3):
        bucket = [(name, tensor.clone()) for name, tensor in items[start : start + 3]]
        for name, tensor in bucket:
            # Built parameters are copied into the model during the call (update_weights does).
            built.update({n: t.clone() for n, t in assembler.add(name, tensor)})
        assembler.own_pending()
        for _, tensor in bucket:
            tensor.fill_(float("nan"))  # the next bucket lands here
    assert sorted(built) == sorted(expected) and all(torch.equal(built[n], expected[n]) for n in expected)


# --- config translation ---------------------------------------------------------------------------------------
def test_transformer_config_translation(micro_model):
    _, hf_config = hf_state(micro_model)
    config = MegatronConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, bf16=True)
    layout = GptLayout.from_hf_config(hf_config, padded_vocab_size=1024)
    kwargs = transformer_config_kwargs(layout, hf_config, config, torch.bfloat16)
    assert kwargs["num_layers"] == 4 and kwargs["num_query_groups"] == 2 and kwargs["kv_channels"] == 64
    assert kwargs["normalization"] == "RMSNorm" and kwargs["gated_linear_unit"] and kwargs["add_qkv_bias"]
    assert kwargs["activation_func"] is F.silu and not kwargs["add_bias_linear"]
    assert kwargs["bf16"] and not kwargs["fp16"] and kwargs["pipeline_dtype"] == torch.bfloat16
    assert kwargs["perform_initialization"]  # megatron tags TP-sharded weights only when it initializes them
    assert not kwargs["batch_p2p_comm"]  # two pipeline stages
    model = gpt_model_kwargs(layout, hf_config)
    assert model["vocab_size"] == 1024 and model["position_embedding_type"] == "rope"
    assert model["rotary_base"] == rope_settings(hf_config)[0] and not model["share_embeddings_and_output_weights"]


def test_rope_settings():
    default = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert rope_settings(default) == (1e6, False, 8.0)
    legacy = SimpleNamespace(rope_scaling=None, rope_theta=5e5)
    assert rope_settings(legacy) == (5e5, False, 8.0)
    llama3 = SimpleNamespace(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0})
    assert rope_settings(llama3) == (5e5, True, 32.0)
    odd = SimpleNamespace(rope_parameters={"rope_type": "llama3", "low_freq_factor": 2.0})
    with pytest.raises(StrategyError, match="low_freq_factor"):
        rope_settings(odd)
    with pytest.raises(StrategyError, match="yarn"):
        rope_settings(SimpleNamespace(rope_parameters={"rope_type": "yarn"}))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_type": "gpt2"}, "not supported"),
        ({"num_experts": 8}, "mixture-of-experts"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"model_type": "llama", "attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "sliding-window"),
    ],
)
def test_unsupported_models_are_rejected(overrides, message):
    config = SimpleNamespace(model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    for key, value in overrides.items():
        setattr(config, key, value)
    with pytest.raises(StrategyError, match=message):
        check_model_supported(config)


def test_parallel_fit_names_model_and_parallel_fields(tiny_model):
    _, hf_config = hf_state(tiny_model)  # 2 heads, 1 key/value head, 2 layers
    layout = GptLayout.from_hf_config(hf_config)
    check_parallel_fit(layout, MegatronConfig(pipeline_model_parallel_size=2))
    with pytest.raises(ConfigError, match="num_key_value_heads=1 is not divisible by tensor_model_parallel_size=2"):
        check_parallel_fit(layout, MegatronConfig(tensor_model_parallel_size=2))
    with pytest.raises(ConfigError, match="num_hidden_layers=2"):
        check_parallel_fit(
            layout, MegatronConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
        )


def test_vocab_padding_and_precision():
    assert padded_vocab_size(1000, 128, 1) == 1024 and padded_vocab_size(1025, 128, 2) == 1280
    assert resolve_params_dtype(MegatronConfig(), "bfloat16") == torch.bfloat16
    assert resolve_params_dtype(MegatronConfig(fp16=True), "bfloat16") == torch.float16
    assert resolve_params_dtype(MegatronConfig(bf16=False), "bfloat16") == torch.float32


def test_optimizer_and_scheduler_translation():
    args = TrainingArgs(learning_rate=2e-5, weight_decay=0.1, max_grad_norm=None, min_lr_ratio=0.1)
    optimizer = optimizer_config_kwargs(args, MegatronConfig(), torch.bfloat16)
    assert optimizer["lr"] == 2e-5 and optimizer["min_lr"] == pytest.approx(2e-6) and optimizer["bf16"]
    assert optimizer["clip_grad"] > 1e9  # no clipping, but megatron still reports the norm
    assert optimizer["use_distributed_optimizer"]
    constant = scheduler_kwargs(TrainingArgs(warmup_steps=3))
    assert constant["lr_decay_style"] == "constant" and constant["lr_warmup_steps"] == 3
    assert constant["lr_decay_steps"] > constant["lr_warmup_steps"]
    cosine = scheduler_kwargs(TrainingArgs(lr_scheduler_type="cosine", max_steps=100, warmup_ratio=0.1))
    assert (cosine["lr_warmup_steps"], cosine["lr_decay_steps"], cosine["lr_decay_style"]) == (10, 100, "cosine")
    with pytest.raises(ConfigError, match="max_steps"):
        scheduler_kwargs(TrainingArgs(lr_scheduler_type="linear"))
    with pytest.raises(ConfigError, match="warmup"):
        scheduler_kwargs(TrainingArgs(lr_scheduler_type="linear", max_steps=5, warmup_steps=5))


def test_rank_info_comes_from_parallel_state():
    # Global rank 5 of tp=2 x pp=2 x dp=2 in megatron's default order (tp fastest, then dp, then pp).
    state = SimpleNamespace(
        get_data_parallel_rank=lambda: 0,
        get_data_parallel_world_size=lambda: 2,
        get_tensor_model_parallel_rank=lambda: 1,
        get_tensor_model_parallel_world_size=lambda: 2,
        get_pipeline_model_parallel_rank=lambda: 1,
        get_pipeline_model_parallel_world_size=lambda: 2,
        get_context_parallel_rank=lambda: 0,
        get_context_parallel_world_size=lambda: 1,
    )
    info = rank_info_from_parallel_state(state, rank=5, world_size=8)
    assert (info.dp_rank, info.dp_size, info.tp_rank, info.pp_rank) == (0, 2, 1, 1)
    assert info.is_pipeline_last_stage and not info.is_collect_rank


# --- batches --------------------------------------------------------------------------------------------------
def test_rows_are_left_aligned_and_logits_restored():
    ids = torch.tensor([[0, 0, 5, 6, 7], [5, 6, 7, 8, 0], [0, 5, 6, 0, 0]])
    mask = (ids != 0).long()
    assert left_shifts(mask).tolist() == [2, 0, 1]
    prepared = prepare_inputs(ids, mask, multiple=4, pad_token_id=0)
    assert prepared.padded_length == 8 and prepared.length == 5
    assert prepared.input_ids.tolist() == [[5, 6, 7, 0, 0, 0, 0, 0], [5, 6, 7, 8, 0, 0, 0, 0], [5, 6, 0, 0, 0, 0, 0, 0]]
    assert prepared.position_ids[0].tolist() == list(range(8))
    # Logits that encode (row, aligned position) must come back at the original positions of real tokens.
    logits = torch.arange(8, dtype=torch.float32).view(1, 8, 1).expand(3, 8, 6) + 100 * torch.arange(3).view(3, 1, 1)
    restored = restore_logits(logits, prepared, vocab_size=4)
    assert restored.shape == (3, 5, 4) and restored.dtype == torch.float32
    for row in range(3):
        real = mask[row].bool()
        assert restored[row, real, 0].tolist() == [100.0 * row + t for t in range(int(real.sum()))]


def test_padding_inside_a_row_is_rejected():
    ids = torch.tensor([[5, 0, 6]])
    with pytest.raises(StrategyError, match="contiguous"):
        prepare_inputs(ids, (ids != 0).long())


@pytest.mark.parametrize("cp", [2, 3])
def test_zigzag_split_and_merge_are_inverse(cp):
    x = torch.arange(2 * cp * 3).view(1, -1)
    parts = [zigzag_split(x, rank, cp) for rank in range(cp)]
    assert parts[0][0, :3].tolist() == [0, 1, 2] and parts[0][0, 3:].tolist() == x[0, -3:].tolist()
    assert torch.equal(zigzag_merge(parts), x)
    assert sequence_multiple(2, True, cp) == 2 * 2 * cp and sequence_multiple(2, False, 1) == 1


def test_context_parallel_inputs_are_zigzag_chunks():
    ids = torch.randint(1, 50, (2, 7))
    mask = torch.ones_like(ids)
    parts = [prepare_inputs(ids, mask, multiple=4, cp_rank=r, cp_size=2) for r in range(2)]
    assert parts[0].input_ids.shape == (2, 4)
    assert torch.equal(zigzag_merge([p.input_ids for p in parts])[:, :7], ids)


_CP_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from roll.strategies.megatron._batching import GatherContextParallel, zigzag_split

    rank, port = int(sys.argv[1]), sys.argv[2]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    full = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(0))
    local = zigzag_split(full, rank, 2).clone().requires_grad_()
    gathered = GatherContextParallel.apply(local, dist.group.WORLD)
    weights = torch.arange(48.0).view(2, 8, 3)
    (gathered * weights).sum().backward()  # the same "loss" on both ranks
    assert torch.equal(gathered.detach(), full)
    assert torch.equal(local.grad, zigzag_split(weights, rank, 2))
    dist.destroy_process_group()
    print("ok")
    """
)


def test_context_parallel_gather_keeps_only_local_gradients(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    script = tmp_path / "cp_gather.py"
    script.write_text(_CP_SCRIPT)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(rank), port], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for rank in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.decode().strip() == "ok", err.decode()[-2000:]


def test_loss_helpers():
    ids = torch.ones(5, 3, dtype=torch.long)
    batch = DataProto.from_dict({"input_ids": ids, "mask": torch.tensor([[1, 1, 0]] * 5)})
    assert count_loss_tokens(batch, None) == 5
    assert count_loss_tokens(batch, "mask") == 10
    with pytest.raises(StrategyError, match="missing"):
        count_loss_tokens(batch, "missing")
    micros = pad_micro_batches(batch, 2)
    assert [(len(m), real) for m, real in micros] == [(2, 2), (2, 2), (2, 1)]
    # Megatron: grad = 1/(dp*cp) * sum over ranks of d(cp * scale * loss / n_micro); with our scale that is the sum.
    dp, cp, n_micro = 4, 2, 3
    assert (cp * loss_scale(dp, n_micro) / n_micro) / (dp * cp) == pytest.approx(1.0)


# --- HF folders -----------------------------------------------------------------------------------------------
def test_write_hf_folder_shards_and_reloads(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf, hf_config = hf_state(tiny_model)
    mapping = MegatronMapping(GptLayout.from_hf_config(hf_config, padded_vocab_size=640))
    weights = mapping.megatron_to_hf(mapping.hf_to_megatron(hf))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    write_hf_folder(tmp_path / "out", weights.items(), hf_config, tokenizer=tokenizer, max_shard_bytes=200_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "out").glob("model-*.safetensors"))) > 1
    reader = HfCheckpointReader(tmp_path / "out")
    assert sorted(reader.names) == sorted(weights)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    state = model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())
    assert AutoTokenizer.from_pretrained(tmp_path / "out").vocab_size == tokenizer.vocab_size
    # A smaller export into the same folder replaces the shards.
    write_hf_folder(tmp_path / "out", weights.items(), hf_config)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == ["model.safetensors"]


# --- GPU: real megatron-core runs -----------------------------------------------------------------------------
def _gpu_worker(path: Path, strategy_name: str, **strategy_config):
    pytest.importorskip("megatron.core")
    from roll.strategies import ModelArgs, StrategyWorker

    config = StrategyWorkerConfig(
        name=strategy_name,
        model_args=ModelArgs(model_name_or_path=str(path), dtype="float32"),
        training_args=TrainingArgs(learning_rate=1e-3, per_device_train_batch_size=2, max_grad_norm=None),
        strategy_args=StrategyArgs(strategy_name=strategy_name, strategy_config=strategy_config),
    )
    worker = StrategyWorker(config)
    worker.initialize()
    return worker


def _padded_batch(vocab: int) -> DataProto:
    ids = torch.randint(2, vocab, (4, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, -2:] = 0
    labels = torch.where(mask.bool(), ids, -100)
    labels[torch.arange(4), mask.argmax(1)] = -100  # nothing predicts a row's first token
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "labels": labels})


@pytest.mark.gpu
def test_gpu_megatron_train_matches_hf(micro_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from roll.strategies.ops import language_model_loss, position_ids_from_attention_mask

    worker = _gpu_worker(micro_model, "megatron_train", bf16=False, fp16=False)
    strategy = worker.strategy
    batch = _padded_batch(1000)
    ids, mask, labels = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["labels"]
    hf = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32).cuda()
    inputs = {
        "input_ids": ids.cuda(),
        "attention_mask": mask.cuda(),
        "position_ids": position_ids_from_attention_mask(mask).cuda(),
    }
    with torch.no_grad():
        reference = hf(**inputs).logits.cpu()
    logits = strategy.forward_step(batch, lambda micro, out: {"logits": out})["logits"]
    torch.testing.assert_close(logits[mask.bool()], reference[mask.bool()], rtol=1e-3, atol=1e-3)

    tokens = int((labels[:, 1:] != -100).sum())
    batch.batch["shifted"] = torch.cat([labels[:, 1:] != -100, torch.zeros(4, 1, dtype=torch.bool)], 1).long()

    def loss_func(micro, out, scale):
        return language_model_loss(out, micro.batch["labels"], num_tokens=scale.num_tokens)[0], {}

    def train_step():
        return strategy.train_step(batch, loss_func, loss_mask_key="shifted")

    expected_loss = language_model_loss(hf(**inputs).logits.float(), labels.cuda(), num_tokens=tokens)[0]
    metrics = train_step()
    assert metrics["loss"] == pytest.approx(float(expected_loss), rel=1e-3)
    expected_loss.backward()
    norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in hf.parameters() if p.grad is not None))
    assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-3)

    weights = dict(strategy.named_weights())
    assert "lm_head.weight" in weights and len(weights) == len(hf.state_dict())
    strategy.export_hf(str(tmp_path / "export"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).state_dict()
    assert all(torch.equal(exported[name], tensor.cpu()) for name, tensor in weights.items())

    strategy.save_checkpoint(str(tmp_path / "ckpt"))
    first = train_step()
    after_first = {name: tensor.cpu().clone() for name, tensor in strategy.named_weights()}
    strategy.load_checkpoint(str(tmp_path / "ckpt"))
    again = train_step()
    assert first["loss"] == again["loss"]
    assert all(torch.equal(after_first[name], tensor.cpu()) for name, tensor in strategy.named_weights())
    strategy.offload_states()
    strategy.load_states()
    assert train_step()["loss"] < metrics["loss"]


@pytest.mark.gpu
def test_gpu_megatron_infer_receives_weights(micro_model):
    from transformers import AutoModelForCausalLM

    worker = _gpu_worker(micro_model, "megatron_infer", bf16=False, fp16=False)
    strategy = worker.strategy
    hf = AutoModelForCausalLM.from_pretrained(micro_model, dtype=torch.float32)
    with torch.no_grad():
        for param in hf.parameters():
            param.mul_(0.9)
    items = list(hf.state_dict().items())
    random.Random(1).shuffle(items)
    for start in range(0, len(items), 7):  # buckets in arbitrary order
        strategy.update_weights(items[start : start + 7])
    strategy.process_weights_after_loading()
    batch = _padded_batch(1000)
    logits = strategy.forward_step(batch, lambda micro, out: {"logits": out})["logits"]
    mask = batch.batch["attention_mask"]
    from roll.strategies.ops import position_ids_from_attention_mask

    with torch.no_grad():
        reference = hf(
            input_ids=batch.batch["input_ids"], attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
        ).logits
    torch.testing.assert_close(logits[mask.bool()], reference[mask.bool()], rtol=1e-3, atol=1e-3)
