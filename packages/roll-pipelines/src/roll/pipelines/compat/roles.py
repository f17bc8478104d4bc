"""The role sections of a ROLL config (WorkerConfig: model, training, generation, data, strategy) in roll's shape;
the strategy settings are in :mod:`roll.pipelines.compat.strategy_args`."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from roll.pipelines.compat.keys import (
    DATA_ARGS,
    GENERATING_ARGS,
    MODEL_ARGS,
    REWARD_CLASSES,
    ROLE_KEYS,
    ROLL_DTYPES,
    ROLL_SAMPLING_DEFAULTS,
    TRAINING_ARGS,
    Rule,
)
from roll.pipelines.compat.strategy_args import strategy_from_role, translate_strategy

if TYPE_CHECKING:
    from roll.pipelines.compat.translate import _Translator

__all__ = ["RoleTranslator"]

_ATTN = {"fa2": "flash_attention_2", "auto": None}
_POLICY_ROLES = ("actor_train", "actor_infer", "reference", "sft_train", "student_infer")


_PG_KEYS = {
    "pg_variant": "policy_loss.variant",
    "topr_positive_weight": "policy_loss.topr_positive_weight",
    "topr_negative_weight": "policy_loss.topr_negative_weight",
}


def _pg_worker(raw: dict[str, Any]) -> bool:
    return str(raw.get("worker_cls") or "").endswith("ActorPGWorker")


def _fields(model: type[BaseModel]) -> set[str]:
    names = set(model.model_fields)
    for info in model.model_fields.values():  # validation aliases (data_args: prompt, response, messages, tag)
        alias = info.validation_alias
        for choice in getattr(alias, "choices", []) or []:
            names.add(str(choice))
    return names


class RoleTranslator:
    def __init__(self, top: _Translator) -> None:
        from roll.pipelines.config import _role_model

        self.top = top
        self.role_models = {
            name: found
            for name, info in top.config_cls.model_fields.items()
            if (found := _role_model(info.annotation)) is not None
        }

    def is_role(self, key: str) -> bool:
        return key in self.role_models

    # --- one role -------------------------------------------------------------------------------------------
    def translate_role_field(self, key: str, value: Any) -> Any:
        model, is_dict = self.role_models[key]
        if value is None or not isinstance(value, dict):
            return value
        if is_dict:
            return {name: self.role(f"{key}.{name}", model, role) for name, role in value.items()}
        return self.role(key, model, value)

    def role(self, path: str, model: type[BaseModel], raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        top = self.top
        known = _fields(model)
        out: dict[str, Any] = {}
        reward_class = self.reward_class(path, raw)
        for key, value in raw.items():
            where = f"{path}.{key}"
            if key == "worker_cls":
                self.worker_cls(where, value, reward_class, out)
            elif key == "reward_type" and reward_class == "crossthinkqa":
                out.setdefault("reward_kwargs", {})["mode"] = value
                top.row(where, "renamed", f"{path}.reward_kwargs.mode", "ROLL's soft/hard scoring mode")
            elif key == "reward_type" and reward_class is not None:
                top.row(where, "ignored", note=f"ROLL's {reward_class} reward worker does not read reward_type")
            elif key in ("model_args", "training_args", "generating_args", "data_args") and isinstance(value, dict):
                out[key] = self.section(where, key, value, model)
            elif key == "strategy_args" and isinstance(value, dict):
                out[key] = translate_strategy(top, where, value)
            elif key in _PG_KEYS and path == "actor_train":
                self.pg_key(where, key, value, raw)
            elif key == "model_update_frequency":
                top.out.setdefault("model_update_frequency", value)
                top.row(where, "renamed", "rollout.model_update_frequency")
            elif key == "backend_timeout":
                out["start_timeout_s"] = value
                top.row(where, "renamed", f"{path}.start_timeout_s")
            elif key in known:
                out[key] = value
                top.row(where, "kept")
            elif key in ROLE_KEYS and (ROLE_KEYS[key].target or "").startswith("batching."):
                self.batching(path, where, ROLE_KEYS[key], value, out)
            elif key in ROLE_KEYS and top.apply_rule(where, ROLE_KEYS[key], value):
                continue
            elif key in ROLE_KEYS:
                top.row(where, ROLE_KEYS[key].status, ROLE_KEYS[key].target or "", ROLE_KEYS[key].note)
            else:
                out[key] = value
                close = difflib.get_close_matches(key, [*known, *ROLE_KEYS], n=1)
                top.row(where, "unknown", note=f"unknown key; did you mean {close[0]!r}?" if close else "unknown key")
        strategy_from_role(top, path, raw, out)
        if path == "actor_train" and _pg_worker(raw) and "pg_variant" not in raw:
            top.set_path("policy_loss.variant", "vanilla", f"{path}.worker_cls")
            top.row(f"({path}.pg_variant)", "implemented-as", "policy_loss.variant", "ROLL's ActorPGWorker default")
        if reward_class is not None and "reward_type" not in out:
            out["reward_type"] = reward_class
        if reward_class == "code" and "partial_credit" not in out.get("reward_kwargs", {}):
            out.setdefault("reward_kwargs", {})["partial_credit"] = False
            note = "false: ROLL's code reward is 1 when every test passes, else 0 (roll's default gives partial credit)"
            top.row(
                f"({path}.reward_kwargs.partial_credit)", "implemented-as", f"{path}.reward_kwargs.partial_credit", note
            )
        if out.get("data_args") == {} and path != top.trained:
            del out["data_args"]  # ROLL gives every role a template only; roll's data lives on the trained role
        self.pipeline_wide(path, raw, out)
        return out

    def pg_key(self, where: str, key: str, value: Any, raw: dict[str, Any]) -> None:
        """pg_variant and the TOPR weights: read by ROLL's ActorPGWorker only; its plain ActorWorker runs PPO."""
        top = self.top
        if not _pg_worker(raw):
            top.row(where, "ignored", note="only ROLL's ActorPGWorker reads it; this actor_train runs PPO")
            return
        target = _PG_KEYS[key]
        top.set_path(target, "vanilla" if key == "pg_variant" and value is None else value, where)
        top.row(where, "renamed", target)

    def batching(self, path: str, where: str, rule: Rule, value: Any, out: dict[str, Any]) -> None:
        """ROLL's flat batching keys -> the role's ``batching`` section (0/None budgets are ROLL's 'unset')."""
        field = (rule.target or "").removeprefix("batching.")
        section = out.setdefault("batching", {})
        if field.startswith("max_tokens_per_microbatch") and value in (None, 0):
            self.top.row(where, "ignored", note="0/null is ROLL's unset budget")
            return
        section[field] = bool(section.get(field)) or bool(value) if field == "sequence_packing" else value
        self.top.row(where, "renamed", f"{path}.{rule.target}", rule.note)

    def reward_class(self, path: str, raw: dict[str, Any]) -> str | None:
        cls = raw.get("worker_cls")
        if not path.startswith("rewards.") or not isinstance(cls, str):
            return None
        name = cls.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
        return REWARD_CLASSES[name][0] if name in REWARD_CLASSES else None

    def worker_cls(self, where: str, value: Any, reward_class: str | None, out: dict[str, Any]) -> None:
        top = self.top
        text = str(value)
        if not text.startswith("roll.pipeline."):  # roll's own or a user's class: keep it
            out["worker_cls"] = value
            top.row(where, "kept")
            return
        if reward_class is not None:
            from roll.pipelines.rewards import REWARDS

            if reward_class not in REWARDS:
                top.row(
                    where,
                    "unsupported",
                    note=f"{text.rsplit('.', 1)[-1]} maps to reward_type {reward_class!r}, "
                    f"which roll does not have yet (have: {REWARDS.names()})",
                )
                return
            top.row(where, "implemented-as", f"reward_type: {reward_class}")
        elif where.startswith("rewards."):
            top.row(where, "unsupported", note=f"ROLL reward worker {text!r} has no roll counterpart")
        else:
            top.row(where, "implemented-as", note=f"the {top.pipeline} pipeline's own worker for this role")

    # --- nested sections ------------------------------------------------------------------------------------
    def section(self, where: str, name: str, raw: dict[str, Any], role_model: type[BaseModel]) -> dict[str, Any]:
        from roll.pipelines.data import DataArgs
        from roll.strategies import GenerationConfig, ModelArgs, TrainingArgs

        tables: dict[str, tuple[type[BaseModel], dict[str, Rule]]] = {
            "model_args": (ModelArgs, MODEL_ARGS),
            "training_args": (TrainingArgs, TRAINING_ARGS),
            "generating_args": (GenerationConfig, GENERATING_ARGS),
            "data_args": (DataArgs, DATA_ARGS),
        }
        model, rules = tables[name]
        known = _fields(model)
        top = self.top
        out: dict[str, Any] = {}
        for key, value in raw.items():
            here = f"{where}.{key}"
            rule: Rule | None = rules.get(key)
            if key == "dtype" and name == "model_args" and value in ROLL_DTYPES:
                out[key] = ROLL_DTYPES[value]
                top.row(here, "renamed", note=f"{value} -> {ROLL_DTYPES[value]}")
            elif key == "attn_implementation" and value in _ATTN:
                if _ATTN[value] is not None:
                    out[key] = _ATTN[value]
                top.row(here, "renamed", note=f"{value} -> {_ATTN[value] or 'the model default'}")
            elif key == "disable_gradient_checkpointing":
                out["gradient_checkpointing"] = not value
                top.row(here, "renamed", f"{where}.gradient_checkpointing", "negated")
            elif key == "lora_target":
                out["lora_target_modules"] = "all-linear" if value in ("all", "all-linear") else value
                top.row(here, "renamed", f"{where}.lora_target_modules")
            elif key == "additional_target":  # ROLL's peft modules_to_save
                if value:
                    out["lora_modules_to_save"] = value
                top.row(here, "renamed", f"{where}.lora_modules_to_save")
            elif key == "do_sample":
                if value is False:
                    out["temperature"] = 0.0
                top.row(here, "implemented-as", f"{where}.temperature", "false: temperature 0 (greedy)")
            elif key == "domain_interleave_probs":
                top.out["domain_interleave_probs"] = value
                top.row(here, "renamed", "rollout.domain_interleave_probs")
            elif key == "template" and value == "qwen3" and where == f"{top.trained}.data_args":
                # ROLL's qwen3 template renders with enable_thinking true (other roles' data_args are dropped)
                out["enable_thinking"] = True
                top.row(here, "implemented-as", f"{where}.enable_thinking", "true: the tokenizer's own chat template")
            elif key == "template":
                top.row(here, "implemented-as", f"{where}.apply_chat_template", "the tokenizer's own chat template")
            elif key == "ulysses_size" and name == "model_args":
                continue  # a strategy setting in roll: strategy_from_role places it once the strategy is known
            elif key in known:
                out[key] = value
                top.row(here, "kept")
            elif rule is not None and top.apply_rule(here, rule, value):
                continue
            else:
                out[key] = value
                close = difflib.get_close_matches(key, sorted(known), n=1)
                top.row(here, "unknown", note=f"unknown key; did you mean {close[0]!r}?" if close else "unknown key")
        if name == "generating_args":
            self.sampling_defaults(where, out)
        return out

    def sampling_defaults(self, where: str, out: dict[str, Any]) -> None:
        """ROLL samples with its GeneratingArguments defaults where a file's generating_args are silent; roll's own
        defaults differ, so ROLL's are written in (top_p / top_k mean nothing to greedy decoding)."""
        for key, default in ROLL_SAMPLING_DEFAULTS.items():
            if key in out or (key in ("top_p", "top_k") and out.get("temperature") == 0.0):
                continue
            out[key] = default
            self.top.row(f"({where}.{key})", "implemented-as", f"{where}.{key}", f"ROLL default {default!r} written in")

    # --- pipeline-wide values every role takes --------------------------------------------------------------
    def pipeline_wide(self, path: str, raw: dict[str, Any], out: dict[str, Any]) -> None:
        data = self.top.source
        if "rpc_timeout" in data and "rpc_timeout_s" not in out:
            out["rpc_timeout_s"] = data["rpc_timeout"]
        if "model_update_buffer_size_mb" in data and "model_update_buffer_size_mb" not in out:
            out["model_update_buffer_size_mb"] = data["model_update_buffer_size_mb"]
        trained = path in ("actor_train", "critic", "sft_train")
        if trained and "max_grad_norm" in data:
            out.setdefault("training_args", {}).setdefault("max_grad_norm", data["max_grad_norm"])
        if self.top.pipeline == "dpo" and path in ("actor_train", "reference"):
            self.dpo_pairs(path, out)
        prompts = {"rlvr": "actor_train", "rlvr_rollout": "actor_infer"}.get(str(self.top.pipeline))
        if path == prompts and isinstance(out.get("data_args"), dict):
            self.prompt_columns(path, out["data_args"])
        if path == "actor_infer" and self.top.pipeline == "rlvr":
            n = data.get("num_return_sequences_in_group", 1)
            generation = out.setdefault("generating_args", {})
            given = generation.get("num_return_sequences")
            generation["num_return_sequences"] = n
            if given not in (None, n):
                self.top.row(
                    f"{path}.generating_args.num_return_sequences",
                    "implemented-as",
                    note=f"{given} replaced by num_return_sequences_in_group={n}, as ROLL does",
                )
            rl = data.get("response_length")
            if rl is not None and generation.get("max_new_tokens") == rl:
                generation.pop("max_new_tokens")  # response_length sets it

    def prompt_columns(self, path: str, data_args: dict[str, Any]) -> None:
        """ROLL's RLVR datasets carry every column: its rule rewards read ground_truth, and a row's ``domain``
        column, when set, picks its reward domain before its tag does."""
        if self.top.pipeline == "rlvr":
            extra = data_args.setdefault("extra_keys", [])
            if "ground_truth" not in extra:
                extra.append("ground_truth")
        rewards = self.top.source.get("rewards")
        domains = rewards.items() if isinstance(rewards, dict) else []
        if any(
            isinstance(d, dict) and self.reward_class(f"rewards.{name}", d) == "code" for name, d in domains
        ):  # ROLL's code rows carry their tests; rows of other domains have none
            taken = {*data_args.get("extra_keys", []), *data_args.get("optional_keys", [])}
            added = [key for key in ("test_cases", "case_type") if key not in taken]
            if added:
                data_args["optional_keys"] = [*data_args.get("optional_keys", []), *added]
                self.top.row(
                    f"({path}.data_args.optional_keys)",
                    "implemented-as",
                    f"{path}.data_args.optional_keys",
                    f"{added}: ROLL's code reward reads them from the rows that have them",
                )
        if "domain_key" not in data_args:
            data_args["domain_key"] = "domain"
            self.top.row(
                f"({path}.data_args.domain_key)",
                "implemented-as",
                f"{path}.data_args.domain_key",
                "'domain': a row's domain column routes it to that reward domain before its tag, as ROLL",
            )

    def dpo_pairs(self, path: str, out: dict[str, Any]) -> None:
        """ROLL's DPO batch sizes count chosen/rejected pairs (it doubles them); roll's count sequences."""
        args = out.get("training_args")
        if isinstance(args, dict) and isinstance(args.get("per_device_train_batch_size"), int):
            args["per_device_train_batch_size"] *= 2
            self.top.row(
                f"{path}.training_args.per_device_train_batch_size",
                "implemented-as",
                note="doubled: ROLL counts pairs, roll counts sequences",
            )
        if isinstance(out.get("infer_batch_size"), int):
            out["infer_batch_size"] *= 2
            self.top.row(
                f"{path}.infer_batch_size", "implemented-as", note="doubled: ROLL counts pairs, roll counts sequences"
            )

    def validation(self, raw: dict[str, Any]) -> None:
        """ROLL's ``validation`` role: its data is the trained role's eval data, its sampling validation's."""
        top = self.top
        section = top.config_cls.model_fields.get("validation")
        own = _fields(section.annotation) if section is not None and isinstance(section.annotation, type) else set()
        for key, value in raw.items():
            where = f"validation.{key}"
            if key == "data_args" and isinstance(value, dict):
                files = value.get("file_name")
                if files is not None and not top.trained:
                    top.row(f"{where}.file_name", "ignored", note=f"the {top.pipeline} pipeline reads no data files")
                elif files is not None:
                    top.set_path(f"{top.trained}.data_args.eval_file_name", files, where)
                    top.row(f"{where}.file_name", "renamed", f"{top.trained}.data_args.eval_file_name")
                for other in value:
                    if other != "file_name":
                        top.row(f"{where}.{other}", "ignored", note="validation reads data like the trained role")
            elif key == "generating_args" and "generating_args" in own and isinstance(value, dict):
                generation = self.section(where, key, value, BaseModel)
                top.out.setdefault("validation", {}).setdefault("generating_args", {}).update(generation)
            elif key in own:
                top.out.setdefault("validation", {})[key] = value
                top.row(where, "kept")
            else:
                top.row(where, "ignored", note="validation runs on the pipeline's own roles")

    def apply_pretrain(self, data: dict[str, Any]) -> None:
        out = self.top.out
        pairs = (
            ("pretrain", _POLICY_ROLES),
            ("reward_pretrain", ("critic",)),
            ("student_pretrain", ("student",)),
            ("teacher_pretrain", ("teacher",)),
        )
        for key, roles in pairs:
            model = data.get(key)
            if model is None:
                continue
            for role in roles:
                section = out.get(role)
                if role not in self.role_models or (section is None and role != "reference"):
                    continue
                if section is None:
                    continue
                args = section.setdefault("model_args", {})
                args.setdefault("model_name_or_path", model)
