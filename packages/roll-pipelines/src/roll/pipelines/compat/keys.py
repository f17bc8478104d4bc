"""What becomes of every ROLL config key: kept, mapped, renamed, implemented-as, ignored (with why) or unsupported.

Data only; :mod:`roll.pipelines.compat.translate` applies it. A rule's ``noop`` says which values of an unsupported
knob are ROLL's own default (nothing to do), so a file that spells the default loads and one that asks for the
behaviour fails with the rule's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DATA_ARGS",
    "ENV_MANAGER_KEYS",
    "GENERATING_ARGS",
    "MODEL_ARGS",
    "PIPELINE_KEYS",
    "REWARD_CLASSES",
    "REWARD_NORMALIZATION_KEYS",
    "ROLE_KEYS",
    "ROLL_DTYPES",
    "STRATEGY_NAMES",
    "TOP_KEYS",
    "TRAINING_ARGS",
    "Rule",
]

Status = Literal["kept", "mapped", "renamed", "implemented-as", "ignored", "unsupported", "unknown"]


def _falsy(value: Any) -> bool:
    return value in (None, False, 0, 0.0, "", [], {}, "none", "None")


def _equals(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value in allowed


@dataclass(frozen=True)
class Rule:
    """One ROLL key: ``status``, ``target`` (where it goes in roll) and ``note`` (how, or why not)."""

    status: Status
    target: str | None = None
    note: str = ""
    noop: Callable[[Any], bool] | None = None  # unsupported rules: values that ask for nothing (ROLL's default)


def _ignored(note: str) -> Rule:
    return Rule("ignored", note=note)


def _unsupported(note: str, noop: Callable[[Any], bool] = _falsy) -> Rule:
    return Rule("unsupported", note=note, noop=noop)


_BATCHING = "exact: same log-probs and gradients as the padded path (fsdp2, hf_infer, megatron with PP=1)"


def _batching(field: str, note: str = "") -> Rule:
    return Rule("renamed", f"batching.{field}", f"{note}; {_BATCHING}" if note else _BATCHING)


_PROFILING = "profiling/tracing output; roll reports time/* metrics per step instead"
_OFFLOAD = "roll strategies offload and reload their own states between phases; no switch needed"
_DECLARED_UNREAD = "a field of ROLL's PPOConfig that no ROLL pipeline code reads (no effect in ROLL either)"
_API_JUDGE_ONLY = (
    "read by ROLL's LLM judge in judge_model_type api only (there: roll's reward_type llm_judge_api, reward_kwargs "
    "api_url, api_key, model)"
)
_NOT_A_FIELD = "not a field of ROLL's config classes: ROLL's loader (dacite, non-strict) drops it"

# Top-level keys of ROLL's BaseConfig / PPOConfig / RLVRConfig / SFTConfig / DPOConfig. Keys roll has under the
# same name (exp_name, seed, max_steps...) and flat keys of the pipeline's FLAT_KEYS are reported by the translator.
TOP_KEYS: dict[str, Rule] = {
    "hydra": _ignored("Hydra's run settings (working dir, output subdir); roll writes to output_dir"),
    "defaults": Rule("implemented-as", note="Hydra defaults list: the named files are merged in when loading"),
    "pretrain": Rule("implemented-as", "<roles>.model_args.model_name_or_path", "the policy roles' model if unset"),
    "reward_pretrain": Rule("implemented-as", "critic.model_args.model_name_or_path", "the critic's model if unset"),
    "num_return_sequences_in_group": Rule("renamed", "actor_infer.generating_args.num_return_sequences"),
    "track_with": Rule(
        "kept",
        "track_with",
        "ROLL's 'stdout' is roll's 'console'; a name outside ROLL's open-source registry fails, as in ROLL",
    ),
    "rpc_timeout": Rule("implemented-as", "<roles>.rpc_timeout_s", "every role's call timeout"),
    "model_update_buffer_size_mb": Rule("implemented-as", "<roles>.model_update_buffer_size_mb"),
    "max_grad_norm": Rule("implemented-as", "<trained roles>.training_args.max_grad_norm"),
    "sequence_length": Rule(
        "implemented-as", "<trained role>.data_args.max_length", "SFT/DPO: longest prompt+response; RLVR: checked"
    ),
    "logging_dir": _ignored("roll logs to the console and output_dir/metrics.jsonl"),
    "base_dir": _ignored("paths are relative to the working directory"),
    "checkpoint_config": Rule(
        "implemented-as",
        "checkpoint_dir",
        "its output_dir (type file_system, ROLL's one uploader) is where roll writes checkpoints, without ROLL's "
        "per-run timestamp folder, so resume_from_checkpoint=auto finds them",
    ),
    "save_logging_board_dir": _ignored("roll's tensorboard dir is tracker_kwargs.log_dir"),
    "rollout_dump_dir": _ignored("rollout.dump writes output_dir/rollouts/step-N.jsonl"),
    "local_rank": _ignored("set by the launcher in ROLL; roll's workers know their rank"),
    "max_running_requests": _ignored("engine concurrency; roll's engines take the whole rollout batch"),
    "generate_opt_level": _ignored("ROLL's scheduler option; roll generates each step's batch in one call"),
    "is_num_return_sequences_expand": _ignored("scheduler detail; samples per prompt come from num_return_sequences"),
    "val_prompt_length": _ignored("validation prompts use rollout.prompt_length"),
    "val_sequence_length": _ignored("validation uses rollout.response_length unless validation.generating_args"),
    "profiler_timeline": _ignored(_PROFILING),
    "profiler_memory": _ignored(_PROFILING),
    "report_length_and_rewards": _ignored("roll logs rollout lengths and rewards every step"),
    "length_profiler_dir": _ignored(_PROFILING),
    "profiler_output_dir": _ignored(_PROFILING),
    "otlp_output_dir": _ignored(_PROFILING),
    "is_offload_states": _ignored(_OFFLOAD),
    "is_offload_optimizer_states_in_train_step": _ignored(_OFFLOAD),
    "model_download_type": _ignored("roll loads local HF folders (no model hub download)"),
    "transfer_backend": _ignored("weights move by roll's model-update groups"),
    "global_template": Rule("implemented-as", note="chat formatting by the tokenizer's own chat template"),
    "tag_to_template": _ignored("one chat template (the tokenizer's) for every domain"),
    "reward": _unsupported("a single `reward` role: give reward domains under `rewards`"),
    "reward_model": Rule(
        "implemented-as",
        "rewards.<judge domain>",
        "the judge server of judge_model_type: cluster; its model, strategy and devices become the judge domain's",
    ),
    "pg_variant": _ignored("ROLL reads pg_variant from actor_train (ActorPGWorker); at the top it feeds ${} only"),
    "topr_positive_weight": _ignored("ROLL reads the TOPR weights from actor_train, not from the top level"),
    "topr_negative_weight": _ignored("ROLL reads the TOPR weights from actor_train, not from the top level"),
    "use_pg_clip_range": Rule("implemented-as", note="false: pg_clip_low/pg_clip_high are ignored, as in ROLL"),
    "use_reward_scaling": _ignored(_DECLARED_UNREAD),
    "add_len_reward": _ignored(_DECLARED_UNREAD),
    "use_reward_norm": _ignored(_DECLARED_UNREAD + "; running normalization is norm_mean_type/norm_std_type: running"),
    "reward_norm": _ignored(_NOT_A_FIELD + "; ROLL's reward normalization is norm_mean_type/norm_std_type"),
    "reward_shift": _ignored(_NOT_A_FIELD),
    "reward_scale": _ignored(_NOT_A_FIELD),
    "enable_reference": Rule(
        "implemented-as", note="roll creates the reference role when KL uses it (kl.in_reward or kl.use_loss)"
    ),
    "force_disable_old_logprobs_recompute": Rule("implemented-as", "correction.old_log_probs_recompute", "true: false"),
    "train_infer_correction": Rule(
        "implemented-as", "correction.*", "is_weight -> truncated IS (tis_cap, tis_level); filters -> filters"
    ),
    "dataset_filter": _ignored(_DECLARED_UNREAD.replace("PPOConfig", "RLVRConfig") + ": no dataset is filtered"),
    "positive_loss_coef": _ignored(
        "not a ROLL field (ROLL's is spelled postive_loss_coef, roll's policy_loss.positive_loss_coef), so ROLL "
        "drops it too"
    ),
    "reward_system_config": _unsupported("a remote reward system"),
    "use_policy_loss_type": _ignored("a field of ROLL's RLVRConfig that no ROLL code reads (no effect in ROLL either)"),
    "use_topr_loss": _ignored(
        "a field of ROLL's RLVRConfig that no ROLL code reads since July 2025 (TOPR: pg_variant topr, or "
        "use_topr_neg_loss_coef)"
    ),
    "val_greedy": Rule("implemented-as", "validation.generating_args", "true: temperature 0"),
    "val_n_sample": Rule("renamed", "validation.generating_args.num_return_sequences"),
    "mask_type": _ignored(_DECLARED_UNREAD.replace("PPOConfig", "RLVRConfig")),
    "max_len_mask": Rule("renamed", "overlong.mask_truncated", "ROLL's name for masking truncated responses"),
    "balance_length": _ignored("load balancing of lengths across ranks; performance only"),
    "minibatch_data_iter_num": _ignored(_DECLARED_UNREAD.replace("PPOConfig", "RLVRConfig")),
    # SFT / DPO top-level data keys
    "prompt_key": Rule("renamed", "<trained role>.data_args.prompt_key"),
    "query_key": Rule(
        "renamed", "<trained role>.data_args.query_key", "appended to the prompt after a newline when non-empty"
    ),
    "response_key": Rule("renamed", "<trained role>.data_args.response_key"),
    "system_key": Rule("renamed", "<trained role>.data_args.system_key"),
    "chosen_key": Rule("renamed", "actor_train.data_args.chosen_key"),
    "rejected_key": Rule("renamed", "actor_train.data_args.rejected_key"),
    "ipo": Rule("renamed", "loss.loss_type", "true: ipo"),
    # distill (ROLL's DistillConfig)
    "student_pretrain": Rule("implemented-as", "student.model_args.model_name_or_path", "the student's model if unset"),
    "teacher_pretrain": Rule("implemented-as", "teacher.model_args.model_name_or_path", "the teacher's model if unset"),
    "question_key": Rule("renamed", "<trained role>.data_args.prompt_key", "distill: the question column"),
    "answer_key": Rule("renamed", "<trained role>.data_args.response_key", "distill: the answer column"),
    "logits_transfer_backend": _ignored(
        "roll moves the teacher's top-k logits through its own transfer (object store)"
    ),
    # on-policy distillation (ROLL's start_onpolicy_distill_pipeline.py)
    "pure_opd_pipeline_type": Rule(
        "implemented-as",
        note="rlvr: the RLVR pipeline with is_pure_opd; agentic: the agentic pipeline with is_pure_opd, teachers "
        "routed by env tag",
    ),
    # values used only as interpolation sources are reported by the translator
}

_YAML_HOLDER = "not a field of ROLL's config (a YAML anchor holder or a leftover): ROLL's loader drops it"

# Top-level keys of one pipeline's ROLL config that are neither roll fields nor that pipeline's flat keys.
PIPELINE_KEYS: dict[str, dict[str, Rule]] = {
    "agentic": {
        "enable_old_logprobs_recompute": _ignored("roll recomputes old log-probs whenever the update is off-policy"),
        # PPOConfig keys of RLVR's that ROLL's agentic pipeline never reads (no effect in ROLL either)
        **{
            key: _ignored(
                "ROLL's agentic pipeline normalizes by reward_normalization (grouping, method, norm_mean_type, "
                "norm_std_type); the top-level key is RLVR's"
            )
            for key in ("norm_mean_type", "norm_std_type")
        },
        **{
            key: _ignored(
                "ROLL's agentic pipeline bounds a sample by sequence_length (rollout.sequence_length) and each turn "
                "by custom_envs.<tag>.max_tokens_per_step; the key is RLVR's"
            )
            for key in ("prompt_length", "response_length")
        },
        "render_save_dir": _ignored("roll does not save rendered env frames"),
        **{
            key: _ignored("a field of ROLL's AgenticConfig that no ROLL code reads (no effect in ROLL either)")
            for key in ("use_token_reward", "dirty_data_mask", "open_feedback_turn")
        },
        "exp_mode": _ignored(
            "no ROLL pipeline code reads the top-level one (ROLL's ROCK env takes exp_mode in its env_config)"
        ),
        "partial_gpu_mode": _ignored(
            "ROLL's shrinking of actor_infer onto actor_train's GPUs between phases; a deployment knob with no "
            "effect on results (roll's strategies offload between phases)"
        ),
        "env_monitor": _ignored(
            "ROLL's watchdog that logs hung envs; roll ends an env call longer than custom_envs.<tag>.step_timeout_s"
        ),
        "skip_mock_system_prompt": _ignored(
            "ROLL renders messages that open without a system message after a mock empty one and cuts it (true: "
            "as given, for templates that add no default); roll renders an opening as given (ROLL's true) and "
            "later turns after an anchor conversation that has a system message, so none gets a default one"
        ),
        **{
            key: _ignored(_YAML_HOLDER)
            for key in (
                "all_response_pattern",
                "single_prompt_agent_system_template",
                "single_prompt_agent_template",
                "custom_env",
                "model_name",
                "gem_games",
                "gem_rg",
                "default_history_length",
            )
        },
    },
}

PIPELINE_KEYS["agentic_rollout"] = {
    **PIPELINE_KEYS["agentic"],
    "async_generation_ratio": _ignored("the rollout-only pipeline trains nothing: no policy versions to be stale"),
    **{
        key: _ignored("the rollout-only pipeline trains nothing: no reward to add a KL penalty to")
        for key in ("add_token_level_kl", "init_kl_coef", "kl_ctrl_type", "target_kl", "kl_horizon")
    },
}

# Keys of ROLL's EnvManagerConfig (train_env_manager, val_env_manager) that roll's does not take.
ENV_MANAGER_KEYS: dict[str, Rule] = {
    "format_penalty": _ignored("a field of ROLL's EnvManagerConfig that no ROLL code reads (envs set their own)"),
    "llm_proxy": Rule(
        "kept",
        "llm_proxy",
        "proxy_type policy, openai (an OpenAI-compatible endpoint, proxy_config as ROLL's; a ROLL file's talks chat, "
        "api: chat written in) or random "
        "(the env's random actions); openai and random in agentic_rollout or a val_env_manager only. policy's and "
        "random's proxy_config is dropped (ROLL reads none)",
    ),
}

# Keys of ROLL's RewardNormalizationConfig that roll's does not take.
REWARD_NORMALIZATION_KEYS: dict[str, Rule] = {
    key: _ignored("a field of ROLL's RewardNormalizationConfig that no ROLL code reads (no effect in ROLL either)")
    for key in ("global_scale_factor", "global_shift_value")
}

# Keys of ROLL's WorkerConfig (a role) that roll does not have under the same name.
ROLE_KEYS: dict[str, Rule] = {
    "worker_cls": Rule("implemented-as", note="ROLL worker classes map to roll's role workers / reward types"),
    "pg_variant": Rule(
        "renamed", "policy_loss.variant", "actor_train with worker_cls ActorPGWorker (default vanilla); else ignored"
    ),
    "model_update_frequency": Rule("renamed", "rollout.model_update_frequency"),
    "backend_timeout": Rule("renamed", "start_timeout_s", "seconds to start the backend"),
    "offload_nccl": _ignored("NCCL buffer offload; roll keeps communicators"),
    "topr_positive_weight": Rule("renamed", "policy_loss.topr_positive_weight", "actor_train, ActorPGWorker"),
    "topr_negative_weight": Rule("renamed", "policy_loss.topr_negative_weight", "actor_train, ActorPGWorker"),
    "use_dynamic_batching_in_train": _batching("dynamic_batching_in_train"),
    "max_tokens_per_microbatch_in_train": _batching("max_tokens_per_microbatch_in_train", "0/null: unset"),
    "sequence_length_round_in_train": _batching("sequence_length_round_in_train"),
    "use_dynamic_batching_in_infer": _batching("dynamic_batching_in_infer"),
    "max_tokens_per_microbatch_in_infer": _batching("max_tokens_per_microbatch_in_infer", "0/null: unset"),
    "sequence_length_round_in_infer": _batching("sequence_length_round_in_infer"),
    "use_sequence_packing": _batching("sequence_packing"),
    "sequence_packing_args": _ignored(
        "packing algorithm/limits: roll packs each micro-batch's rows into one sequence; bound it with "
        "max_tokens_per_microbatch_*"
    ),
    "use_remove_padding": _batching(
        "sequence_packing", "removing padding is packing the rows (either key turns it on)"
    ),
    "router_replay": _unsupported(
        "MoE router replay", noop=lambda v: _falsy(v) or (isinstance(v, dict) and v.get("mode") in (None, "disable"))
    ),
    "apply_loss_scale": _ignored("roll scales the loss by the whole mini-batch's token/sample counts"),
    "mtp_training_mode": _unsupported("multi-token-prediction training", noop=_equals(None, "disabled")),
    "opd_kl_coef": _unsupported("opd_kl_coef outside a teacher role (teacher / teachers.<name> take it)"),
    "infer_batch_size": Rule("kept"),
    # reward-domain keys (RewardConfig in ROLL): moved into reward_kwargs by the translator
    "code_url": _ignored("roll's code reward runs the tests in its own local sandbox"),
    "use_local": _ignored("roll's code reward runs the tests in its own local sandbox"),
    "judge_prompt": _ignored("used by ROLL's LLM judge only (there: reward_kwargs.prompt_style ROLL/<name>)"),
    "judge_model_type": _ignored("roll's judge generates with its role's strategy ('cluster': see reward_model)"),
    "judge_model_name": _ignored(_API_JUDGE_ONLY),
    "judge_api_url": _ignored(_API_JUDGE_ONLY),
    "judge_api_key": _ignored(_API_JUDGE_ONLY),
    "format_pattern": _ignored(
        "ROLL's math rule reward worker matches responses against it and returns none of the result: no effect on "
        "ROLL's rewards or metrics either"
    ),
    "response_length_penalty_coef": _unsupported("response length penalty"),
    "query_filter_config": Rule(
        "kept",
        "rewards.<domain>.query_filter_config",
        "mean_filter/std_filter per reward domain; dropped prompt groups are replaced by newly generated ones",
    ),
    "response_filter_config": _ignored("ROLL's response filter keeps every response whatever this says"),
    "reward_manager_config": _unsupported("reward system plugins"),
}

MODEL_ARGS: dict[str, Rule] = {
    "disable_gradient_checkpointing": Rule("renamed", "gradient_checkpointing", "negated"),
    "model_type": _ignored("roll picks the model class from model_head (causal_lm / value)"),
    "device_map": _ignored("placement comes from device_mapping"),
    "lora_target": Rule("renamed", "lora_target_modules"),
    "additional_target": Rule("renamed", "lora_modules_to_save", "modules trained in full beside the LoRA adapters"),
    "autocast_adapter_dtype": _ignored("adapters follow the model dtype"),
    "adapter_name_or_path": _unsupported(
        "loading an existing LoRA adapter (ROLL declares the field, but no ROLL code reads it: it loads no adapter "
        "either); merge the adapter into the model and point model_name_or_path at the merged folder"
    ),
    "moe_aux_loss_coef": _ignored("MoE auxiliary loss coefficient (model default kept)"),
    "gradient_checkpointing_use_reentrant": _ignored("roll uses non-reentrant checkpointing"),
    "num_labels": _ignored("value heads have one output"),
    "flash_attn": _ignored("attention kernel choice; use attn_implementation"),
    "ulysses_size": Rule(
        "renamed",
        "strategy_args.strategy_config.ulysses_size",
        "fsdp2_train / fsdp2_infer: Ulysses sequence parallelism, exact; other backends ignore it (as in ROLL)",
    ),
}

TRAINING_ARGS: dict[str, Rule] = {
    "output_dir": _ignored("roll writes under the pipeline's output_dir"),
    "data_seed": _ignored("data order follows data_args.seed"),
    "dataloader_num_workers": _ignored("roll loads data in the driver"),
    "save_hf_model": _ignored("export_hf (pipeline-wide) writes the HF model at the end"),
    "adam_beta1": Rule("kept"),
    "adam_beta2": Rule("kept"),
}

# ROLL's GeneratingArguments defaults (roll/configs/generating_args.py) for the sampling settings a ROLL file's
# generating_args leave out; roll's own defaults differ (top_p 1, no top_k, temperature 1), so they are written in.
ROLL_SAMPLING_DEFAULTS: dict[str, float | int] = {"temperature": 0.95, "top_p": 0.7, "top_k": 50}

GENERATING_ARGS: dict[str, Rule] = {
    "num_beams": _unsupported("beam search", noop=_equals(None, 1)),
    "do_sample": Rule("implemented-as", "temperature", "false: temperature 0 (greedy)"),
    "max_length": _ignored("the budget is max_new_tokens (rollout.response_length)"),
    "length_penalty": _unsupported("beam length penalty", noop=_equals(None, 1.0, 1)),
    "include_stop_str_in_output": _ignored("stop strings stay in the response text"),
}

DATA_ARGS: dict[str, Rule] = {
    "template": Rule(
        "implemented-as",
        "apply_chat_template",
        "the tokenizer's own chat template; qwen3 (ROLL renders it with enable_thinking true): enable_thinking: true",
    ),
    "dataset_dir": _ignored("file_name paths are used as written (relative to the working directory)"),
    "interleave_probs": _ignored("several files are concatenated; per-domain shares: domain_interleave_probs"),
    "preprocessing_num_workers": _ignored("encoding runs in the driver"),
    "domain_interleave_probs": Rule("renamed", "rollout.domain_interleave_probs"),
    "dataset_type": _ignored("the file suffix gives the format"),
    "id": _ignored("rows are identified by their position"),
    "custom_data_kwargs_func": _unsupported("custom data functions"),
    "image_folder": _unsupported("images (multimodal data)"),
    "video_folder": _unsupported("videos (multimodal data)"),
    "audio_folder": _unsupported("audio (multimodal data)"),
}
for _key in (
    "image_max_pixels",
    "image_min_pixels",
    "video_max_pixels",
    "video_min_pixels",
    "video_total_pixels",
    "video_fps",
    "video_max_frames",
    "video_resize_chunk_frames",
):
    DATA_ARGS[_key] = _ignored("multimodal sizing; roll's pipelines take text")

# ROLL strategy names -> roll's (None: no roll backend; the note names the replacement).
# ROLL's dtype spellings (model_args.dtype, strategy_config *dtype) -> torch names
ROLL_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
STRATEGY_NAMES: dict[str, tuple[str | None, str]] = {
    "megatron_train": ("megatron_train", ""),
    "megatron_infer": ("megatron_infer", ""),
    "vllm": ("vllm", ""),
    "sglang": ("sglang", ""),
    "hf_infer": ("hf_infer", ""),
    "fsdp2_train": ("fsdp2_train", ""),
    "fsdp2_infer": ("fsdp2_infer", ""),
    "mock_infer": ("mock_infer", ""),
    "deepspeed_infer": ("hf_infer", "DeepSpeed inference has no roll backend; hf_infer runs the same forward"),
    "deepspeed_train": (
        None,
        "roll has no DeepSpeed backend: use strategy_name fsdp2_train (sharded like ZeRO-3) or megatron_train",
    ),
    "diffusion_deepspeed_train": (None, "roll has no DeepSpeed backend: use fsdp2_train"),
}

# ROLL reward worker classes (last dotted part) -> (roll reward_type, reward_kwargs to add).
REWARD_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    "MathRuleRewardWorker": ("math", {}),
    "CodeSandboxRewardWorker": ("code", {}),
    "LLMJudgeRewardWorker": ("llm_judge", {}),
    "GeneralRuleRewardWorker": ("ifeval", {}),
    "CrossThinkQARuleRewardWorker": ("crossthinkqa", {}),
    "MultipleChoiceBoxedRuleRewardWorker": ("multiple_choice", {}),
    "GeneralValRuleRewardWorker": ("general_val", {}),
}
