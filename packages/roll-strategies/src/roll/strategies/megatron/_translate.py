"""HF config / roll settings -> megatron-core constructor arguments (pure: plain dicts, no megatron import).

The strategy passes these dicts to ``TransformerConfig``, ``GPTModel``, ``OptimizerConfig`` and
``OptimizerParamScheduler``; keeping the translation here makes every value testable without megatron.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from roll.protocol import RankInfo
from roll.runtime import ConfigError
from roll.strategies.config import TrainingArgs
from roll.strategies.contract import StrategyError
from roll.strategies.megatron._mapping import GptLayout
from roll.strategies.megatron.config import MegatronConfig

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "check_model_supported",
    "check_parallel_fit",
    "gpt_model_kwargs",
    "optimizer_config_kwargs",
    "padded_vocab_size",
    "rank_info_from_parallel_state",
    "resolve_params_dtype",
    "rope_settings",
    "scheduler_kwargs",
    "transformer_config_kwargs",
]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_NO_CLIP = 1e12
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Megatron's llama3 RoPE scaling hard-codes these; other values would silently change the model.
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def resolve_params_dtype(config: MegatronConfig, model_dtype: str) -> torch.dtype:
    """bf16/fp16 flags win; with neither set, follow ``model_args.dtype``; flags set to false mean float32."""
    if config.bf16:
        return torch.bfloat16
    if config.fp16:
        return torch.float16
    if config.bf16 is None and config.fp16 is None:
        return _DTYPES[model_dtype]
    return torch.float32


def padded_vocab_size(vocab_size: int, divisible_by: int, tp_size: int) -> int:
    """Megatron's embedding rows: ``vocab_size`` rounded up to a multiple of ``divisible_by * tp_size``."""
    multiple = divisible_by * tp_size
    return int(math.ceil(vocab_size / multiple) * multiple)


def rope_settings(hf_config: Any) -> tuple[float, bool, float]:
    """``(rotary_base, rope_scaling, rope_scaling_factor)`` for GPTModel; raises for RoPE types megatron lacks."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    theta = float(params.get("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, False, 8.0
    if rope_type == "llama3":
        for key, expected in _LLAMA3_ROPE.items():
            if float(params.get(key, expected)) != expected:
                raise StrategyError(
                    f"llama3 RoPE scaling with {key}={params[key]} is not supported by megatron-core (it uses "
                    f"{expected}); use another backend for this model"
                )
        return theta, True, float(params.get("factor", 8.0))
    raise StrategyError(f"RoPE type {rope_type!r} is not supported by the megatron backend (default, llama3 are)")


def check_model_supported(hf_config: Any) -> None:
    """Raise StrategyError unless the model is a dense Llama/Qwen2/Qwen3/Mistral that the mapping covers."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise StrategyError(
            f"the megatron backend maps {', '.join(SUPPORTED_MODEL_TYPES)} models; {model_type!r} is not supported "
            "(use fsdp2_train for it)"
        )
    if any(getattr(hf_config, key, None) for key in ("num_experts", "num_local_experts", "n_routed_experts")):
        raise StrategyError("mixture-of-experts models are not covered by the megatron weight mapping yet")
    if getattr(hf_config, "mlp_bias", False):
        raise StrategyError("MLP biases (mlp_bias=true) are not supported by the megatron backend")
    if model_type in ("llama", "mistral") and getattr(hf_config, "attention_bias", False):
        # Llama's attention_bias also adds an o_proj bias, which megatron's add_qkv_bias does not cover.
        raise StrategyError("attention_bias=true (q/k/v/o biases) is not supported for llama-style models")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise StrategyError(f"hidden_act={hf_config.hidden_act!r} is not supported (the mapping assumes SwiGLU)")
    if getattr(hf_config, "use_sliding_window", False) or (
        model_type == "mistral" and getattr(hf_config, "sliding_window", None)
    ):
        raise StrategyError("sliding-window attention is not supported by the megatron backend")
    rope_settings(hf_config)


def check_parallel_fit(layout: GptLayout, config: MegatronConfig) -> None:
    """Raise ConfigError (naming the fields) if the model cannot be split as configured."""
    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    chunks = pp * (config.virtual_pipeline_model_parallel_size or 1)
    checks = [
        (layout.num_attention_heads, tp, "num_attention_heads", "tensor_model_parallel_size"),
        (layout.num_query_groups, tp, "num_key_value_heads", "tensor_model_parallel_size"),
        (layout.ffn_hidden_size, tp, "intermediate_size", "tensor_model_parallel_size"),
        (layout.num_layers, chunks, "num_hidden_layers", "pipeline_model_parallel_size x virtual stages"),
    ]
    for value, parts, model_field, parallel_field in checks:
        if value % parts:
            raise ConfigError(
                f"the model's {model_field}={value} is not divisible by {parallel_field}={parts}; choose a size "
                f"that divides {value}"
            )


def transformer_config_kwargs(layout: GptLayout, hf_config: Any, config: MegatronConfig, params_dtype: torch.dtype):
    """Keyword arguments of megatron's ``TransformerConfig`` for this model and parallel layout."""
    return {
        "num_layers": layout.num_layers,
        "hidden_size": layout.hidden_size,
        "ffn_hidden_size": layout.ffn_hidden_size,
        "num_attention_heads": layout.num_attention_heads,
        "num_query_groups": layout.num_query_groups,
        "kv_channels": layout.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": float(getattr(hf_config, "rms_norm_eps", 1e-6)),
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": layout.qkv_bias,
        "qk_layernorm": layout.qk_layernorm,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "attention_softmax_in_fp32": True,
        "tensor_model_parallel_size": config.tensor_model_parallel_size,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": config.virtual_pipeline_model_parallel_size,
        "context_parallel_size": config.context_parallel_size,
        "expert_model_parallel_size": config.expert_model_parallel_size,
        "sequence_parallel": config.sequence_parallel,
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        "recompute_granularity": config.recompute_granularity,
        "recompute_method": config.recompute_method,
        "recompute_num_layers": config.recompute_num_layers,
        "transformer_impl": config.transformer_impl,
        # Kept on although the HF weights overwrite it: with it off, megatron-core skips tagging TP-sharded weights
        # (``tensor_model_parallel``), which silently breaks gradient-norm clipping under TP.
        "perform_initialization": True,
        # Fusions need apex/TE kernels; the unfused paths give the same numbers everywhere.
        "masked_softmax_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "gradient_accumulation_fusion": False,
        # With two stages both p2p directions join the same pair of ranks; batched p2p can then pair a forward
        # activation with a backward gradient of the same shape (seen with interleaving). The unbatched path
        # orders them by rank parity.
        "batch_p2p_comm": config.pipeline_model_parallel_size != 2,
        "calculate_per_token_loss": False,
        "variable_seq_lengths": False,
    }


def gpt_model_kwargs(layout: GptLayout, hf_config: Any) -> dict[str, Any]:
    """Keyword arguments of ``GPTModel`` (besides config, spec and the pipeline-stage flags)."""
    rotary_base, rope_scaling, rope_scaling_factor = rope_settings(hf_config)
    return {
        "vocab_size": layout.padded_vocab_size,
        "max_sequence_length": int(getattr(hf_config, "max_position_embeddings", 4096)),
        "share_embeddings_and_output_weights": layout.tie_word_embeddings,
        "position_embedding_type": "rope",
        "rotary_percent": 1.0,
        "rotary_base": rotary_base,
        "rope_scaling": rope_scaling,
        "rope_scaling_factor": rope_scaling_factor,
        "parallel_output": True,
    }


def optimizer_config_kwargs(args: TrainingArgs, config: MegatronConfig, params_dtype: torch.dtype):
    """Keyword arguments of megatron's ``OptimizerConfig`` (Adam with decoupled weight decay, i.e. AdamW)."""
    return {
        "optimizer": "adam",
        "lr": args.learning_rate,
        "min_lr": args.learning_rate * args.min_lr_ratio,
        "weight_decay": args.weight_decay,
        "adam_beta1": args.adam_beta1,
        "adam_beta2": args.adam_beta2,
        "adam_eps": args.adam_epsilon,
        # Megatron computes the gradient norm only when it clips; a bound that never binds still reports it.
        "clip_grad": args.max_grad_norm if args.max_grad_norm is not None else _NO_CLIP,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        "params_dtype": params_dtype,
        "use_distributed_optimizer": config.use_distributed_optimizer,
    }


def scheduler_kwargs(args: TrainingArgs) -> dict[str, Any]:
    """Keyword arguments of ``OptimizerParamScheduler`` matching ``lr_scheduler_type`` and warmup settings."""
    style = args.lr_scheduler_type
    if style != "constant" and args.max_steps is None:
        raise ConfigError(f"training_args.max_steps is needed for lr_scheduler_type={style!r} (it sets the decay)")
    warmup = args.warmup_steps
    if not warmup and args.warmup_ratio and args.max_steps:
        warmup = math.ceil(args.warmup_ratio * args.max_steps)
    if style == "constant":
        decay_steps = max(args.max_steps or 0, warmup + 1)
    else:
        decay_steps = int(args.max_steps or 0)
        if warmup >= decay_steps:
            raise ConfigError(
                f"warmup ({warmup} steps) must be shorter than training_args.max_steps ({decay_steps}) "
                f"for lr_scheduler_type={style!r}"
            )
    return {
        "init_lr": 0.0,
        "max_lr": args.learning_rate,
        "min_lr": args.learning_rate * args.min_lr_ratio if style != "constant" else 0.0,
        "lr_warmup_steps": warmup,
        "lr_decay_steps": decay_steps,
        "lr_decay_style": style,
        "start_wd": args.weight_decay,
        "end_wd": args.weight_decay,
        "wd_incr_steps": decay_steps,
        "wd_incr_style": "constant",
    }


def rank_info_from_parallel_state(parallel_state: Any, rank: int, world_size: int) -> RankInfo:
    """The worker's RankInfo from megatron's ``parallel_state`` module (or anything with its getters).

    The data-parallel coordinates exclude context parallelism: CP ranks of one replica see the same rows.
    """
    return RankInfo(
        rank=rank,
        world_size=world_size,
        dp_rank=parallel_state.get_data_parallel_rank(),
        dp_size=parallel_state.get_data_parallel_world_size(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
        cp_rank=parallel_state.get_context_parallel_rank(),
        cp_size=parallel_state.get_context_parallel_world_size(),
    )
