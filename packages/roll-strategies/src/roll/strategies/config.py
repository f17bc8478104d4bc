"""Configuration of model roles: which model, how to train it, how to generate, which backend.

Only pydantic here: a machine without a backend's library can still validate a config that names it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from roll.runtime import ConfigError, RollModel, WorkerConfig
from roll.runtime.config import parse_device_mapping
from roll.strategies.registry import validate_strategy_config

__all__ = ["BatchingArgs", "GenerationConfig", "ModelArgs", "StrategyArgs", "StrategyWorkerConfig", "TrainingArgs"]

Dtype = Literal["float32", "bfloat16", "float16"]


class ModelArgs(RollModel):
    """The model a role loads."""

    model_name_or_path: str | None = Field(
        default=None,
        description="Local folder in HF format, or a hub id (Hugging Face; ModelScope with USE_MODELSCOPE).",
    )
    tokenizer_name_or_path: str | None = Field(default=None, description="Defaults to model_name_or_path.")
    revision: str | None = Field(
        default=None, description="Branch, tag or commit of a hub id (model and tokenizer); ignored for local folders."
    )
    dtype: Dtype = Field(default="bfloat16", description="Parameter dtype; float32 on CPU unless it supports bf16.")
    attn_implementation: str | None = Field(default=None, description="e.g. 'sdpa', 'eager', 'flash_attention_2'.")
    model_kind: Literal["causal_lm", "diffusion"] = Field(
        default="causal_lm",
        description=(
            "'diffusion': a diffusers model folder (UNet2DModel, DiT...; roll-strategies[diffusion]) that workers "
            "call through forward_model / train_model_step; no tokenizer."
        ),
    )
    model_head: Literal["causal_lm", "value"] = Field(
        default="causal_lm", description="'value' loads a one-output token-classification head (PPO critic)."
    )
    model_config_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the model's HF config (ROLL's key; e.g. rope_scaling, max_position_embeddings): "
        "transformers' config for hf_infer, fsdp2 and megatron, vLLM's hf_overrides, SGLang's "
        "json_model_override_args. Give every role that shares the weights the same.",
    )
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    lora_rank: int = Field(default=0, ge=0, description="0 disables LoRA.")
    lora_alpha: int = Field(default=16, ge=1)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    lora_target_modules: list[str] | str = Field(default="all-linear")
    lora_modules_to_save: list[str] | None = Field(
        default=None,
        description="With LoRA: modules trained in full beside the adapters (ROLL's additional_target, peft's "
        "modules_to_save), by name or name suffix, e.g. embed_tokens or lm_head; a value head's score always is.",
    )
    freeze_module_prefix: list[str] | None = Field(
        default=None,
        description="Training roles: freeze the parameters whose name starts with one of these prefixes (ROLL's "
        "comma-separated string or a list; HF names such as model.embed_tokens, megatron_train also takes "
        "megatron-core names); they are not updated and not in the optimizer. Not with LoRA.",
    )

    @field_validator("freeze_module_prefix", "lora_modules_to_save", mode="before")
    @classmethod
    def _split_prefixes(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",")]
        if isinstance(value, list) and any(not isinstance(item, str) or not item.strip() for item in value):
            what = "prefix" if info.field_name == "freeze_module_prefix" else "module name"
            raise ValueError(f"{info.field_name} has an empty {what} ({value!r}); remove the extra comma")
        return value or None

    @model_validator(mode="after")
    def _freeze_without_lora(self) -> ModelArgs:
        if self.freeze_module_prefix and self.lora_rank > 0:
            raise ValueError(
                "freeze_module_prefix and lora_rank are both set; with LoRA only the adapters train (ROLL ignores "
                "freeze_module_prefix then), so remove one of them"
            )
        if self.lora_modules_to_save and self.lora_rank == 0:
            raise ValueError(
                f"lora_modules_to_save {self.lora_modules_to_save} is set but lora_rank is 0: it names the modules "
                "trained in full beside LoRA adapters; set lora_rank, or drop it to train the whole model"
            )
        return self

    @property
    def tokenizer_path(self) -> str | None:
        return self.tokenizer_name_or_path or self.model_name_or_path


class TrainingArgs(RollModel):
    """Optimizer, schedule and batching of a training role."""

    learning_rate: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_epsilon: float = Field(default=1e-8, gt=0)
    max_grad_norm: float | None = Field(default=1.0, description="Gradient clipping; None disables it.")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    warmup_ratio: float = Field(default=0.0, ge=0, le=1)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Cosine/linear decay floor as a ratio of lr.")
    per_device_train_batch_size: int = Field(default=1, ge=1, description="Rows per forward/backward (micro-batch).")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    num_train_epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1, description="Optimizer steps for LR schedules.")
    seed: int = 42

    @property
    def schedule_uses_max_steps(self) -> bool:
        """Whether the learning rate follows ``max_steps``: a decaying schedule, or a warm-up given as a ratio."""
        return self.lr_scheduler_type != "constant" or (self.warmup_ratio > 0 and not self.warmup_steps)

    @field_validator("max_grad_norm")
    @classmethod
    def _positive_clip(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("max_grad_norm must be positive, or null to disable clipping")
        return value


class GenerationConfig(RollModel):
    """How a role samples: the backend maps these to vLLM / SGLang / HF parameters."""

    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, description="-1 disables top-k.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    num_return_sequences: int = Field(default=1, ge=1, description="Samples per prompt (GRPO group size).")
    stop_strings: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: bool = Field(default=True, description="Return the log-prob of every sampled token.")

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("top_k must be -1 (disabled) or a positive number of tokens")
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class BatchingArgs(RollModel):
    """How a role groups rows into micro-batches and lays them out for the model (fsdp2_train / fsdp2_infer,
    hf_infer, megatron_*). Exact: the functions a Worker passes see the same logits at every real token (up to float
    rounding) and losses divide by the mini-batch's global counts, so only speed and memory change."""

    dynamic_batching_in_train: bool = Field(
        default=False,
        description=(
            "Training micro-batches by token budget (max_tokens_per_microbatch_in_train) instead of "
            "per_device_train_batch_size rows: rows of similar length go together, all-padding columns are dropped."
        ),
    )
    max_tokens_per_microbatch_in_train: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Token budget of a training micro-batch: rows x padded width, or the packed length with "
            "sequence_packing. A longer row runs alone."
        ),
    )
    sequence_length_round_in_train: int = Field(
        default=1, ge=1, description="Round micro-batch widths (packed lengths) up to a multiple of this."
    )
    dynamic_batching_in_infer: bool = Field(
        default=False, description="Forward (log-prob) micro-batches by token budget instead of infer_batch_size rows."
    )
    max_tokens_per_microbatch_in_infer: int | None = Field(
        default=None, ge=1, description="Token budget of a forward micro-batch (see the _in_train field)."
    )
    sequence_length_round_in_infer: int = Field(
        default=1, ge=1, description="Round forward micro-batch widths (packed lengths) up to a multiple of this."
    )
    sequence_packing: bool = Field(
        default=False,
        description=(
            "Padding-free forward and training: each micro-batch's rows are concatenated without padding into one "
            "sequence whose position_ids restart per row (varlen kernels with flash_attention_2; with sdpa/eager, "
            "SDPA once per packed sequence on fsdp2 and a block-diagonal mask on hf). Needs position_ids counting "
            "0, 1, ... over each row's real tokens."
        ),
    )

    @model_validator(mode="after")
    def _budget_given(self) -> BatchingArgs:
        for phase in ("train", "infer"):
            if (
                getattr(self, f"dynamic_batching_in_{phase}")
                and getattr(self, f"max_tokens_per_microbatch_in_{phase}") is None
            ):
                raise ValueError(
                    f"dynamic_batching_in_{phase} needs max_tokens_per_microbatch_in_{phase} (a token budget per "
                    "micro-batch, e.g. 2 x the longest sequence x the rows you would otherwise put in one)"
                )
        return self


class StrategyArgs(RollModel):
    """Backend selection: ``strategy_name`` (e.g. ``fsdp2_train``, ``vllm``) and its backend-specific settings."""

    strategy_name: str = Field(description="A registered strategy, e.g. hf_infer, fsdp2_train, vllm, megatron_train.")
    strategy_config: dict[str, Any] = Field(
        default_factory=dict, description="Validated by the backend's config model."
    )


class StrategyWorkerConfig(WorkerConfig):
    """A model role: the runtime's deployment fields plus model, training, generation and backend settings."""

    model_args: ModelArgs = Field(default_factory=ModelArgs)
    training_args: TrainingArgs = Field(default_factory=TrainingArgs)
    generating_args: GenerationConfig = Field(default_factory=GenerationConfig)
    strategy_args: StrategyArgs | None = None
    infer_batch_size: int = Field(default=8, ge=1, description="Rows per forward micro-batch when not training.")
    batching: BatchingArgs = Field(
        default_factory=BatchingArgs, description="Token-budget micro-batches and sequence packing (exact)."
    )
    model_update_buffer_size_mb: int = Field(default=256, ge=1, description="Weight-sync bucket size.")
    num_threads: Annotated[int, Field(ge=1)] | Literal["all"] | None = Field(
        default=None,
        description=(
            "torch threads per worker. Unset or 'auto': 'all' for CPU roles (no device_mapping), whose phases take "
            "turns on the machine's cores, and Ray's default (null) for device roles. See WorkerConfig.num_threads."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_deployment(cls, data: Any) -> Any:
        """Fill what follows from other fields, before validation: num_threads 'auto', and, unless given, the devices
        each worker owns (e.g. vLLM's TP x PP engine), so users set that in one place: the backend's config."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        try:
            mapping = parse_device_mapping(data.get("device_mapping"))
        except ValueError:
            return data  # reported by the field's own validation
        if data.get("num_threads", "auto") == "auto":
            data["num_threads"] = "all" if mapping is None else None
        per_worker = _devices_per_worker(data.get("strategy_args"))
        if per_worker is not None and mapping is not None and data.get("num_gpus_per_worker") is None:
            data["num_gpus_per_worker"] = per_worker
        return data

    @model_validator(mode="after")
    def _check_strategy_config(self) -> StrategyWorkerConfig:
        # Validate the backend's settings now (pydantic only, no backend import) so a typo fails at load time.
        if self.strategy_args is None:
            return self
        name = self.strategy_args.strategy_name
        validated = validate_strategy_config(name, self.strategy_args.strategy_config)
        per_worker = getattr(validated, "devices_per_worker", None)
        if self.device_mapping is not None and per_worker is not None and per_worker != self.num_gpus_per_worker:
            raise ValueError(
                f"num_gpus_per_worker={self.num_gpus_per_worker} but each {name} worker uses {per_worker} device(s) "
                f"(its strategy_config's parallel sizes); remove num_gpus_per_worker (it is derived) or set it to "
                f"{per_worker}"
            )
        return self


def _devices_per_worker(strategy_args: Any) -> int | None:
    """``devices_per_worker`` of the backend named by raw ``strategy_args``, or None (also when it is invalid)."""
    settings: Any
    if isinstance(strategy_args, StrategyArgs):
        name, settings = strategy_args.strategy_name, strategy_args.strategy_config
    elif isinstance(strategy_args, dict) and isinstance(strategy_args.get("strategy_name"), str):
        name, settings = strategy_args["strategy_name"], strategy_args.get("strategy_config")
    else:
        return None
    try:
        validated = validate_strategy_config(name, settings if isinstance(settings, dict) else None)
    except ConfigError:  # the after-validator reports it, with its field path
        return None
    per_worker = getattr(validated, "devices_per_worker", None)
    return per_worker if isinstance(per_worker, int) else None
