"""ROLL's defaults that differ from roll's, written into a translated config where the file leaves them out: the
node count ROLL derives from device mappings, the columns its SFT, DPO and distill read, its distill length, its OPD launcher's
switch and its RLVR and agentic (PPOConfig) defaults."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roll.pipelines.compat.translate import _Translator

__all__ = [
    "DERIVED_FROM",
    "ROLL_AGENTIC_DEFAULTS",
    "ROLL_ENV_DEFAULTS",
    "ROLL_MAX_STEPS",
    "ROLL_OPENAI_PROXY_DEFAULTS",
    "ROLL_REWARD_NORMALIZATION",
    "ROLL_RLVR_DEFAULTS",
    "ROLL_TOOL_FORMAT",
    "fill_roll_defaults",
]

# ROLL's pipeline steps when a file sets none (roll's default is 100): an RL pipeline runs that many
ROLL_MAX_STEPS = 500
# roll's top-level fields that values written in here are derived from (max_steps sizes the agentic schedule): a
# command-line override of one must reach the translation, not only the translated config
DERIVED_FROM = frozenset({"max_steps"})
# ROLL PPOConfig defaults that differ from roll's: written in when the file does not set them (flat key -> value)
ROLL_RLVR_DEFAULTS: dict[str, Any] = {
    "adv_estimator": "gae",
    "lambd": 0.95,
    "init_kl_coef": 0.2,
    "kl_loss_coef": 0.0,
    "kl_penalty": "kl",
    "loss_agg_mode": "seq-mean-token-mean",
    "value_clip": None,
    "rollout_batch_size": 128,
}
# ROLL AgenticConfig (a PPOConfig too) defaults that differ from roll's agentic ones, likewise; kl_penalty is
# _fill_agentic_kl's. The agentic actor aggregates its loss by loss_agg_mode, so a ROLL file without it trains
# seq-mean-token-mean, not roll's token-mean.
ROLL_AGENTIC_DEFAULTS: dict[str, Any] = {
    "adv_estimator": "gae",
    "lambd": 0.95,
    "kl_loss_coef": 0.0,
    "loss_agg_mode": "seq-mean-token-mean",
    "rollout_batch_size": 128,
    "val_batch_size": 128,
    "value_clip": None,
}
# ROLL's RewardNormalizationConfig defaults: no normalization (roll's agentic default for grpo is per group)
ROLL_REWARD_NORMALIZATION = {"grouping": "batch", "method": "identity"}
# ROLL's env constructors' defaults where roll's envs of the same type differ (env_type -> env_config key -> value):
# ROLL's Sokoban makes 10x10 rooms with 4 boxes from 300 reverse moves, its FrozenLake is slippery.
ROLL_ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "sokoban": {"dim_room": [10, 10], "num_boxes": 4, "search_depth": 300},
    "frozen_lake": {"is_slippery": True},
}
# ROLL's tools are GEM's: the model calls them with GEM's tags (<code>/<python>, <search>, ...), not roll's default
# Hermes <tool_call> JSON; a ROLL file's tool_wrapper gets tool_format gem unless it sets one.
ROLL_TOOL_FORMAT = "gem"
# ROLL's openai llm_proxy posts the conversation's messages to chat.completions (roll's default, api: completions,
# posts the rendered prompt: a hosted chat-only model answers 404) and asks the server's chat template for no thinking
# unless generating_args enable it: a ROLL file's openai proxy_config gets these unless it sets them.
ROLL_OPENAI_PROXY_DEFAULTS: dict[str, Any] = {"api": "chat", "enable_thinking": False}


def _derive_num_nodes(top: _Translator, data: dict[str, Any]) -> None:
    """ROLL ignores a file's num_nodes: it counts nodes from the highest device id in any role's
    device_mapping and num_gpus_per_node (its default 8; at run time the machine's GPU count)."""
    from roll.runtime.config import parse_device_mapping

    ids: list[int] = []
    for value in top.out.values():
        roles = value.values() if isinstance(value, dict) and "device_mapping" not in value else [value]
        for role in roles:
            if isinstance(role, dict) and role.get("device_mapping") is not None:
                try:
                    ids += parse_device_mapping(role["device_mapping"]) or []
                except ValueError:
                    continue  # reported by validation with the role's name
    if not ids:
        return
    per_node = top.out.setdefault("num_gpus_per_node", data.get("num_gpus_per_node", 8))
    if not isinstance(per_node, int) or per_node < 1:
        return
    nodes = -(-(max(ids) + 1) // per_node)
    if "num_nodes" in data and data["num_nodes"] != nodes:
        top.rows = [row for row in top.rows if row.key != "num_nodes"]
        top.row("num_nodes", "implemented-as", "num_nodes", f"{data['num_nodes']} replaced: ROLL derives it")
    top.out["num_nodes"] = nodes
    top.row("(num_nodes)", "implemented-as", "num_nodes", f"{nodes}: highest device id / num_gpus_per_node, as ROLL")


# Strategy settings that split a role's workers into model-parallel groups: ROLL's data-parallel size is the workers
# over their product (Megatron's tensor, pipeline and context parallelism; the FSDP2 and DeepSpeed Ulysses groups).
_MODEL_PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "ulysses_size",
)
# ROLL's TrainingArguments defaults (transformers'): a file that leaves them out trains with these
_ROLL_TRAINING_BATCH = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _data_parallel_size(role: dict[str, Any]) -> int | None:
    """A translated role's data-parallel size as ROLL derives it (workers over the model-parallel product); None
    when the role's settings do not say (validation reports bad ones)."""
    from roll.runtime.config import parse_device_mapping

    try:
        devices = parse_device_mapping(role.get("device_mapping"))
    except ValueError:
        return None
    per_worker = role.get("num_gpus_per_worker", 1)
    workers = len(devices) // per_worker if devices and isinstance(per_worker, int) else role.get("world_size", 1)
    config = _mapping(_mapping(role.get("strategy_args")).get("strategy_config"))
    split = 1
    for key in _MODEL_PARALLEL_KEYS:
        value = config.get(key) or 1
        if not isinstance(value, int) or value < 1:
            return None
        split *= value
    if not isinstance(workers, int) or workers < split:
        return None
    return workers // split


def _fill_backward_batch(top: _Translator, data: dict[str, Any]) -> None:
    """ROLL's actor_train takes an optimizer step per backward batch, per_device_train_batch_size x
    gradient_accumulation_steps rows of each data-parallel rank, so a step's rows make rows x ppo_epochs / (that x
    dp) optimizer steps; roll takes one per ``update.mini_batch_size`` rows (default: all of them, one step). The
    backward batch over all ranks is written in as the mini-batch size. A ROLL agentic pipeline sizes the learning
    rate schedule as max_steps x rollout_batch_size x ppo_epochs over that, whatever the rows (step-wise rows follow
    the turns): written in as actor_train's ``training_args.max_steps``, as ROLL sets it."""
    actor = top.out.get("actor_train")
    update = top.out.get("update")
    given = "ppo_mini_batch_size" in top.out or (isinstance(update, dict) and "mini_batch_size" in update)
    if not isinstance(actor, dict) or given or "ppo_mini_batch_size" not in top.flat:
        return
    args = _mapping(actor.get("training_args"))
    rows_per_rank = 1
    for key, default in _ROLL_TRAINING_BATCH.items():
        value = args.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return  # validation names the bad value
        rows_per_rank *= value
    dp = _data_parallel_size(actor)
    if dp is None:
        return
    mini = rows_per_rank * dp
    top.out["ppo_mini_batch_size"] = mini
    top.row(
        "(backward batch)",
        "implemented-as",
        top.flat["ppo_mini_batch_size"],
        f"{mini} rows per optimizer step, as ROLL's actor_train: per_device_train_batch_size x "
        f"gradient_accumulation_steps ({rows_per_rank}) x {dp} data-parallel rank(s)",
    )
    steps, batch, epochs = top.out.get("max_steps"), top.out.get("rollout_batch_size"), data.get("ppo_epochs", 1)
    if top.pipeline != "agentic" or "max_steps" in args:
        return
    if not (isinstance(steps, int) and isinstance(batch, int) and isinstance(epochs, int)):
        return  # validation names the bad value
    total = max(1, steps * batch * epochs // mini)
    top.set_path("actor_train.training_args.max_steps", total, "(schedule length)")
    top.row(
        "(schedule length)",
        "implemented-as",
        "actor_train.training_args.max_steps",
        f"{total}: max_steps x rollout_batch_size x ppo_epochs / the backward batch, as ROLL sizes it",
    )


# The columns ROLL's SFT, DPO and distill pipelines read when a file names none (pipeline -> trained role, roll's
# data_args key -> (ROLL's top-level key or None, ROLL's column)): its SFTConfig's Alpaca defaults, its DPO's fixed
# 'instruction' prompt column (DPOConfig has no key for it), its DistillConfig's question/answer defaults.
_ROLL_COLUMNS: dict[str, tuple[str, dict[str, tuple[str | None, str]]]] = {
    "sft": ("sft_train", {"prompt_key": ("prompt_key", "instruction"), "response_key": ("response_key", "output")}),
    "dpo": ("actor_train", {"prompt_key": (None, "instruction")}),
    "distill": ("student", {"prompt_key": ("question_key", "question"), "response_key": ("answer_key", "answer")}),
}


def _fill_columns(top: _Translator, data: dict[str, Any]) -> None:
    """ROLL's column defaults where they differ from roll's (``prompt``, ``response``), written into the trained
    role's data_args unless the file (or an override) names the column."""
    if top.pipeline not in _ROLL_COLUMNS:
        return
    name, columns = _ROLL_COLUMNS[top.pipeline]
    role = top.out.get(name)
    given = role.get("data_args") if isinstance(role, dict) else None
    for key, (roll_key, value) in columns.items():
        alias = key.removesuffix("_key")
        if key in data or roll_key in data or (isinstance(given, dict) and (key in given or alias in given)):
            continue
        top.set_path(f"{name}.data_args.{key}", value, f"({key})")
        note = f"ROLL default {value!r} written in" if roll_key else f"{value!r}: ROLL's {top.pipeline} reads it"
        top.row(f"({key})", "implemented-as", f"{name}.data_args.{key}", note)


def _fill_distill_split(top: _Translator) -> None:
    """ROLL's distill trains and validates on the rows whose ``split`` column is 'train' (GSM8K_zh holds its train
    and test rows in one file, told apart by that column); rows without the column are kept."""
    role = top.out.get("student")
    given = role.get("data_args") if isinstance(role, dict) else None
    if isinstance(given, dict) and "keep_split" in given:
        return
    top.set_path("student.data_args.keep_split", "train", "(split)")
    top.row(
        "(split)",
        "implemented-as",
        "student.data_args.keep_split",
        "'train': ROLL's distill reads only rows whose `split` is 'train' (training and validation; rows without "
        "the column are kept)",
    )


def _fill_agentic_kl(top: _Translator, data: dict[str, Any]) -> None:
    """ROLL's agentic kl_penalty is the in-reward KL's estimator (default 'kl'); its actor's KL loss is always k3."""
    top.set_path("kl.loss_penalty", "k3", "(kl loss estimator)")
    top.row("(kl loss estimator)", "implemented-as", "kl.loss_penalty", "ROLL's agentic actor KL loss is always k3")
    if "kl_penalty" not in data and "kl_penalty" in top.flat:
        top.out["kl_penalty"] = "kl"
        top.row("(kl_penalty)", "implemented-as", top.flat["kl_penalty"], "ROLL default 'kl' written in")


def _fill_agentic_defaults(top: _Translator, data: dict[str, Any]) -> None:
    for key, value in ROLL_AGENTIC_DEFAULTS.items():
        if key not in data and key in top.flat:
            top.out[key] = value
            top.row(f"({key})", "implemented-as", top.flat[key], f"ROLL default {value!r} written in")
    if "reward_normalization" not in data and "reward_normalization" in top.config_cls.model_fields:
        top.out["reward_normalization"] = dict(ROLL_REWARD_NORMALIZATION)
        top.row(
            "(reward_normalization)",
            "implemented-as",
            "reward_normalization",
            f"ROLL default {ROLL_REWARD_NORMALIZATION} (no normalization) written in",
        )
    section = top.out.get("reward_normalization")
    if not isinstance(section, dict):
        return
    missing = {key: value for key, value in ROLL_REWARD_NORMALIZATION.items() if key not in section}
    if missing:  # roll's grpo would fill a part left out with its own (traj_group_id, mean_std)
        section.update(missing)
        top.row(
            "(reward_normalization)", "implemented-as", "reward_normalization", f"ROLL defaults {missing} written in"
        )


def _fill_env_defaults(top: _Translator) -> None:
    envs = top.out.get("custom_envs")
    if not isinstance(envs, dict):
        return
    filled = {}
    for tag, spec in envs.items():
        defaults = ROLL_ENV_DEFAULTS.get(str(spec.get("env_type"))) if isinstance(spec, dict) else None
        env_config = spec.get("env_config") if defaults is not None else None
        env_config = env_config if isinstance(env_config, dict) else {}
        missing = {key: value for key, value in (defaults or {}).items() if key not in env_config}
        filled[tag] = {**spec, "env_config": {**env_config, **missing}} if missing else spec
        if missing:
            where = f"custom_envs.{tag}.env_config"
            top.row(f"({where})", "implemented-as", where, f"ROLL's {spec['env_type']} defaults {missing} written in")
        filled[tag] = _move_enable_thinking(top, tag, _fill_tool_format(top, tag, filled[tag]))
    top.out["custom_envs"] = filled


def _move_enable_thinking(top: _Translator, tag: str, spec: Any) -> Any:
    """ROLL's env managers read ``enable_thinking`` from the tag's ``env_config`` (its default false, as roll's);
    roll's is the tag's own key (an env constructor is not given it)."""
    env_config = spec.get("env_config") if isinstance(spec, dict) else None
    if not isinstance(env_config, dict) or "enable_thinking" not in env_config:
        return spec
    key, target = f"custom_envs.{tag}.env_config.enable_thinking", f"custom_envs.{tag}.enable_thinking"
    value = env_config["enable_thinking"]
    if "enable_thinking" in spec and spec["enable_thinking"] != value:
        top.row(key, "unsupported", target, f"contradicts {target}={spec['enable_thinking']!r}; keep one")
        return spec
    top.row(key, "implemented-as", target, "the chat template's enable_thinking for the tag's prompts")
    rest = {k: v for k, v in env_config.items() if k != "enable_thinking"}
    return {**spec, "env_config": rest, "enable_thinking": value}


def _fill_tool_format(top: _Translator, tag: str, spec: Any) -> Any:
    wrapper = spec.get("tool_wrapper") if isinstance(spec, dict) else None
    args = wrapper.get("wrapper_args") if isinstance(wrapper, dict) else None
    if not isinstance(wrapper, dict) or "tool_format" in (args if isinstance(args, dict) else {}):
        return spec
    where = f"custom_envs.{tag}.tool_wrapper.wrapper_args.tool_format"
    top.row(f"({where})", "implemented-as", where, f"{ROLL_TOOL_FORMAT!r}: ROLL's tools read GEM's tags")
    args = {**(args if isinstance(args, dict) else {}), "tool_format": ROLL_TOOL_FORMAT}
    return {**spec, "tool_wrapper": {**wrapper, "wrapper_args": args}}


def fill_roll_defaults(top: _Translator, data: dict[str, Any]) -> None:
    """Where ROLL's defaults differ from roll's, write ROLL's in (each with a report row), so the file means what it
    meant under ROLL."""
    _derive_num_nodes(top, data)
    _fill_columns(top, data)
    if top.pipeline == "distill" and "sequence_length" not in data:
        top.set_path("student.data_args.max_length", 2048, "(sequence_length)")
        top.row("(sequence_length)", "implemented-as", "student.data_args.max_length", "ROLL default 2048")
    if top.pipeline == "distill":
        _fill_distill_split(top)
    if top.opd_launcher and "is_pure_opd" not in data:
        top.out["is_pure_opd"] = True
        top.row("(is_pure_opd)", "implemented-as", "opd.pure", "true: ROLL's on-policy distill launcher sets it")
    if top.pipeline == "agentic":
        _fill_agentic_kl(top, data)
    if top.pipeline in ("agentic", "agentic_rollout"):
        _fill_agentic_defaults(top, data)
        _fill_env_defaults(top)
    if top.pipeline in ("agentic", "agentic_rollout", "rlvr") and "max_steps" not in data:
        top.out["max_steps"] = ROLL_MAX_STEPS
        top.row("(max_steps)", "implemented-as", "max_steps", f"ROLL default {ROLL_MAX_STEPS} written in")
    if top.pipeline in ("agentic", "rlvr"):
        _fill_backward_batch(top, data)
    if top.pipeline != "rlvr":
        return
    for key, value in ROLL_RLVR_DEFAULTS.items():
        if key not in data and key in top.flat:
            top.out[key] = value
            top.row(f"({key})", "implemented-as", top.flat[key], f"ROLL default {value!r} written in")
    top.set_path("kl.loss_penalty", "k3", "(kl loss estimator)")
    top.row("(kl loss estimator)", "implemented-as", "kl.loss_penalty", "ROLL's actor KL loss is always k3")
    if top.out.get("is_pure_opd") is True:
        top.set_path("opd.score_rollouts", True, "(opd rollout scores)")
        top.row(
            "(opd rollout scores)",
            "implemented-as",
            "opd.score_rollouts",
            "ROLL's pure OPD scores the training rollouts too (logged, not trained on): true written in",
        )
    top.set_path("advantage.domain_stats", True, "(domain_stats)")
    top.row(
        "(domain_stats)",
        "implemented-as",
        "advantage.domain_stats",
        "ROLL computes rewards and advantages per reward domain: true written in",
    )
