"""ROLL config (a composed, interpolated mapping) -> roll's sectioned config data, with a report of every key.

ROLL's YAML names no pipeline (its launcher script does), so :func:`infer_pipeline` reads it from the file's shape.
:func:`translate` walks every key: roll's own keys are kept, ROLL's flat keys are mapped by the pipeline's
``FLAT_KEYS``, the rest follow :mod:`roll.pipelines.compat.keys`. Where ROLL's defaults differ from roll's, the
ROLL default is written in (:mod:`roll.pipelines.compat.defaults`), so the file means what it meant under ROLL.
Unsupported and unknown keys are reported, never dropped: the caller turns them into one error.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from roll.pipelines.compat.defaults import ROLL_OPENAI_PROXY_DEFAULTS, fill_roll_defaults
from roll.pipelines.compat.hydra import deep_merge
from roll.pipelines.compat.judge import fold_judges
from roll.pipelines.compat.keys import (
    ENV_MANAGER_KEYS,
    PIPELINE_KEYS,
    REWARD_NORMALIZATION_KEYS,
    TOP_KEYS,
    Rule,
    Status,
)
from roll.pipelines.compat.multimodal import multimodal_markers
from roll.pipelines.compat.roles import RoleTranslator
from roll.runtime import ConfigError

__all__ = ["KeyReport", "Translation", "infer_pipeline", "translate"]

PIPELINE_TRAINED_ROLE = {
    "rlvr": "actor_train",
    "sft": "sft_train",
    "dpo": "actor_train",
    "rlvr_rollout": "actor_infer",
    "distill": "student",
    "agentic": "",  # envs make the prompts: no role reads data
    "agentic_rollout": "",
}
UNSUPPORTED_ESTIMATORS = {"gigpo", "step_reinforce", "agentic_reinforce"}


@dataclass(frozen=True)
class KeyReport:
    """One ROLL key: what roll does with it."""

    key: str
    status: Status
    target: str = ""
    note: str = ""


@dataclass
class Translation:
    data: dict[str, Any]
    pipeline: str
    reason: str
    rows: list[KeyReport] = field(default_factory=list)
    applied_overrides: list[str] = field(default_factory=list)  # command-line overrides applied to the ROLL file

    @property
    def problems(self) -> list[KeyReport]:
        return [row for row in self.rows if row.status in ("unsupported", "unknown")]

    def raise_problems(self, source: str) -> None:
        """One ConfigError listing every unsupported or unknown key (nothing is silently dropped)."""
        problems = self.problems
        if problems:
            lines = [f"  {row.key}: {row.status}: {row.note}" for row in problems]
            raise ConfigError(
                f"{source} (ROLL config, pipeline {self.pipeline}): {len(problems)} key(s) roll cannot honour:\n"
                + "\n".join(lines)
            )


def infer_pipeline(data: dict[str, Any]) -> tuple[str, str]:
    """(pipeline name, why) for a ROLL config, from its shape."""
    if data.get("pipeline_cls"):
        return str(data["pipeline_cls"]), "pipeline_cls in the file"
    if not data:
        raise ConfigError(
            "cannot tell which pipeline this ROLL config is for: it is empty (no keys after composing its defaults), "
            "so there is nothing to run, under ROLL too"
        )
    if any(key in data for key in ("student_train", "student_infer", "is_pure_opd")):  # ROLL's OPD launcher
        kind = "agentic" if data.get("pure_opd_pipeline_type") == "agentic" else "rlvr"
        return kind, "it has student_train/student_infer (on-policy distillation: is_pure_opd)"
    shape = [
        ("agentic", ("train_env_manager", "val_env_manager", "custom_envs"), "it has env managers"),
        ("distill", ("teacher", "student", "student_train"), "it has a teacher/student"),
        ("sft", ("sft_train",), "it has sft_train"),
        ("rlvr", ("rewards", "reward"), "it has reward domains"),
        ("dpo", ("ipo", "beta", "chosen_key", "rejected_key"), "it has actor_train + reference and DPO keys"),
    ]
    for name, keys, why in shape:
        if any(key in data for key in keys):
            if name == "agentic" and "actor_train" not in data:
                return "agentic_rollout", why + " and no actor_train (ROLL's agentic rollout pipeline)"
            return name, why
    if "actor_train" in data and "reference" in data and "actor_infer" not in data:
        return "dpo", "it has actor_train + reference and no rollout engine"
    if "actor_infer" in data and "actor_train" not in data:
        return "rlvr_rollout", "it has only a rollout engine (actor_infer)"
    raise ConfigError(
        "cannot tell which pipeline this ROLL config is for (no rewards, sft_train, env managers or teacher); "
        "add pipeline_cls=rlvr|sft|dpo|rlvr_rollout|distill|agentic"
    )


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown key; did you mean {close[0]!r}?" if close else "unknown key; remove it or check its spelling"


class _Translator:
    def __init__(self, config_cls: type[BaseModel], pipeline: str, referenced: set[str]) -> None:
        self.config_cls = config_cls
        self.pipeline = pipeline
        self.referenced = referenced
        self.flat: dict[str, str] = dict(getattr(config_cls, "flat_keys", {}))
        self.rows: list[KeyReport] = []
        self.out: dict[str, Any] = {"pipeline_cls": pipeline}
        self.trained = PIPELINE_TRAINED_ROLE.get(pipeline, "actor_train")  # "": no role holds data
        self.source: dict[str, Any] = {}
        self.opd_launcher = False  # student_train/student_infer: ROLL's on-policy distill launcher's file

    def row(self, key: str, status: Status, target: str = "", note: str = "") -> None:
        self.rows.append(KeyReport(key, status, target, note))

    def apply_rule(self, key: str, rule: Rule, value: Any) -> bool:
        """Record an ignored/unsupported rule; True when the key is done with (nothing to write)."""
        if rule.status == "ignored":
            self.row(key, "ignored", note=rule.note)
            return True
        if rule.status == "unsupported":
            if rule.noop is not None and rule.noop(value):
                self.row(key, "ignored", note=f"{value!r} is ROLL's default (off); roll does not have: {rule.note}")
            else:
                self.row(key, "unsupported", note=f"roll does not implement {rule.note} (got {value!r})")
            return True
        return False

    # --- top level ------------------------------------------------------------------------------------------
    def student_roles(self, data: dict[str, Any]) -> dict[str, Any]:
        """ROLL's OPD spellings student_train / student_infer of actor_train / actor_infer, and its dict of several
        teachers under ``teacher`` as ``teachers``."""
        if self.pipeline not in ("rlvr", "agentic"):  # ROLL's OPD launcher runs either (pure_opd_pipeline_type)
            return data
        renamed = {"student_train": "actor_train", "student_infer": "actor_infer"}
        out = {}
        for key, value in data.items():
            if key in renamed:
                self.row(key, "renamed", renamed[key], "ROLL's on-policy distillation role name")
                self.opd_launcher = True
            out[renamed.get(key, key)] = value
        from roll.pipelines.rlvr.opd import is_teacher_dict

        if is_teacher_dict(out.get("teacher")) and "teachers" not in out:
            names = sorted(out["teacher"])
            self.row("teacher", "renamed", "teachers", f"several OPD teachers {names}, routed by their tag_included")
            out = {("teachers" if key == "teacher" else key): value for key, value in out.items()}
        return out

    def run(self, data: dict[str, Any]) -> None:
        data = fold_judges(self, self.student_roles(data))
        self.source = data
        roles = RoleTranslator(self)
        fields = self.config_cls.model_fields
        for key, value in data.items():
            if key == "pipeline_cls":
                continue
            if key in TOP_KEYS:
                self.top_rule(key, TOP_KEYS[key], value, data)
            elif key in self.flat:
                self.flat_key(key, value, data)
            elif key == "validation" and isinstance(value, dict):
                roles.validation(value)
            elif key in fields:
                if roles.is_role(key):  # merged with what other keys already placed in this role
                    translated = roles.translate_role_field(key, value)
                    earlier = self.out.get(key)
                    if isinstance(earlier, dict) and isinstance(translated, dict):
                        translated = deep_merge(earlier, translated)
                    self.out[key] = translated
                else:
                    self.out[key] = self.section_keys(key, value)
                    self.row(key, "kept")
            elif key in PIPELINE_KEYS.get(self.pipeline, {}):
                self.apply_rule(key, PIPELINE_KEYS[self.pipeline][key], value)
            elif key in self.referenced:
                self.row(key, "ignored", note="a value other keys interpolate (${" + key + "}); resolved when loading")
            else:
                self.out[key] = value
                self.row(key, "unknown", note=_suggest(key, [*fields, *self.flat, *TOP_KEYS]))
        fill_roll_defaults(self, data)
        roles.apply_pretrain(data)

    def section_keys(self, key: str, value: Any) -> Any:
        """ROLL's EnvManagerConfig / RewardNormalizationConfig keys that roll's sections do not take, by their
        rules."""
        rules = ENV_MANAGER_KEYS if key.endswith("_env_manager") else {}
        rules = REWARD_NORMALIZATION_KEYS if key == "reward_normalization" else rules
        if not rules or not isinstance(value, dict):
            return value
        out = dict(value)
        if rules is ENV_MANAGER_KEYS and isinstance(out.get("generating_args"), dict):
            self.manager_sampling(key, out)
        if rules is ENV_MANAGER_KEYS and "llm_proxy" in out:
            self.llm_proxy(key, out)  # kept in place: the loop below leaves it
        for name in [name for name in out if name in rules and name != "llm_proxy"]:
            self.apply_rule(f"{key}.{name}", rules[name], out.pop(name))
        return out

    def llm_proxy(self, key: str, manager: dict[str, Any]) -> None:
        """ROLL's ``llm_proxy``: roll's own, less the ``proxy_config`` of ``policy`` and ``random`` (ROLL reads none)."""
        value = manager["llm_proxy"]
        if value is None:  # ROLL's default: the policy
            manager.pop("llm_proxy")
            self.row(f"{key}.llm_proxy", "ignored", note="null: ROLL's default, the policy")
            return
        if not isinstance(value, dict) or value.get("proxy_type", "policy") == "openai":
            self.row(f"{key}.llm_proxy", "kept", f"{key}.llm_proxy")  # roll's config names what is wrong, if anything
            given = value.get("proxy_config") if isinstance(value, dict) else None
            if isinstance(given, dict):
                self.openai_chat_defaults(key, manager, value, given)
            return
        dropped = bool(value.get("proxy_config"))
        manager["llm_proxy"] = {k: v for k, v in value.items() if k != "proxy_config"}
        note = "proxy_config dropped: ROLL's policy and random proxies read none" if dropped else ""
        self.row(f"{key}.llm_proxy", "kept", f"{key}.llm_proxy", note)

    def openai_chat_defaults(
        self, key: str, manager: dict[str, Any], proxy: dict[str, Any], given: dict[str, Any]
    ) -> None:
        """ROLL's openai proxy talks chat only, with thinking off unless asked: ``ROLL_OPENAI_PROXY_DEFAULTS``
        written into the ``proxy_config`` where the file leaves them out, so a hosted baseline still answers."""
        missing = {k: v for k, v in ROLL_OPENAI_PROXY_DEFAULTS.items() if k not in given}
        if given.get("api", "chat") != "chat":
            # a file that asks for roll's completions api gets no chat-only key (roll refuses one it would not read)
            missing.pop("enable_thinking", None)
        if not missing:
            return
        manager["llm_proxy"] = {**proxy, "proxy_config": {**given, **missing}}
        where = f"{key}.llm_proxy.proxy_config"
        self.row(f"({where})", "implemented-as", where, f"ROLL's openai proxy: {missing} written in")

    def manager_sampling(self, key: str, manager: dict[str, Any]) -> None:
        """ROLL's precedence between an env manager's ``generating_args`` and actor_infer's: a file that sets
        actor_infer's samples both managers with them (the manager's own are dropped); one that does not takes the
        training manager's as actor_infer's (what a manager without its own then samples with)."""
        infer = self.source.get("actor_infer")
        if isinstance(infer, dict) and infer.get("generating_args"):
            manager.pop("generating_args")
            self.row(f"{key}.generating_args", "ignored", note="ROLL samples both env managers with actor_infer's")
        elif key == "train_env_manager":
            self.set_path("actor_infer.generating_args", dict(manager["generating_args"]), key)
            self.row(
                f"{key}.generating_args",
                "implemented-as",
                "actor_infer.generating_args",
                "also actor_infer's, as ROLL copies them when actor_infer sets none",
            )

    def set_path(self, path: str, value: Any, key: str) -> None:
        node = self.out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key} moves to {path}, but {part} is not a section")
        if leaf in node and node[leaf] != value:
            self.row(key, "unsupported", path, f"contradicts {path}={node[leaf]!r} set elsewhere; keep one")
            return
        node[leaf] = value

    def top_rule(self, key: str, rule: Rule, value: Any, data: dict[str, Any]) -> None:
        if self.apply_rule(key, rule, value):
            return
        if key in (
            "pretrain",
            "reward_pretrain",
            "student_pretrain",
            "teacher_pretrain",
            "pure_opd_pipeline_type",
            "defaults",
            "global_template",
            "use_pg_clip_range",
            "enable_reference",
        ):
            self.row(key, rule.status, rule.target or "", rule.note)  # applied in apply_pretrain / flat_key
        elif key == "num_return_sequences_in_group":
            self.row(key, "renamed", "actor_infer.generating_args.num_return_sequences")
        elif key in ("rpc_timeout", "model_update_buffer_size_mb", "max_grad_norm"):
            self.row(key, "implemented-as", rule.target or "", rule.note)  # applied per role by RoleTranslator
        elif key == "sequence_length":
            if self.pipeline in ("sft", "dpo", "distill"):
                self.set_path(f"{self.trained}.data_args.max_length", value, key)
                self.row(key, "renamed", f"{self.trained}.data_args.max_length")
            elif key in self.flat:  # agentic: the longest episode sample; ROLL stops an episode that would pass it
                self.flat_key(key, value, data)
            else:
                self.row(key, "ignored", note="RLVR lengths are rollout.prompt_length + rollout.response_length")
        elif key == "force_disable_old_logprobs_recompute":
            if value:
                self.set_path("correction.old_log_probs_recompute", False, key)
            self.row(key, "implemented-as", "correction.old_log_probs_recompute", "true sets it to false")
        elif key == "train_infer_correction":
            self.train_infer_correction(value)
        elif key == "track_with":
            self.track_with(value)
        elif key == "checkpoint_config":
            self.checkpoint_config(value)
        elif key == "val_greedy":
            if value:
                self.set_path("validation.generating_args.temperature", 0.0, key)
            self.row(key, "implemented-as", "validation.generating_args.temperature", "true: 0 (greedy)")
        elif key == "max_len_mask":
            self.out["mask_truncated"] = value
            self.row(key, "renamed", "overlong.mask_truncated")
        elif key == "ipo":
            self.out["loss_type"] = "ipo" if value else "sigmoid"
            self.row(key, "renamed", "loss.loss_type", "true: ipo, false: sigmoid")
        elif key in (
            "prompt_key",
            "query_key",
            "response_key",
            "chosen_key",
            "rejected_key",
            "question_key",
            "answer_key",
            "system_key",
        ):
            target = rule.target.replace("<trained role>", self.trained) if rule.target else ""
            self.set_path(target, value, key)
            self.row(key, "renamed", target)
        elif rule.target:
            self.set_path(rule.target, value, key)
            self.row(key, rule.status, rule.target, rule.note)
        else:
            self.row(key, rule.status, note=rule.note)

    def checkpoint_config(self, value: Any) -> None:
        """ROLL copies each checkpoint to ``checkpoint_config.output_dir`` (its file_system uploader, the only one in
        its open-source registry, also the default when ``type`` is left out) and deletes the local copy unless
        ``keep_local_file``; roll writes them there directly."""
        if not value:
            self.row("checkpoint_config", "ignored", note=f"{value!r}: no upload in ROLL; roll uses output_dir")
            return
        if not isinstance(value, dict):
            self.row("checkpoint_config", "unsupported", note=f"must be a mapping with output_dir, got {value!r}")
            return
        kind = value.get("type", "file_system")
        if kind != "file_system":
            self.row(
                "checkpoint_config.type",
                "unsupported",
                note=f"{kind!r} is not in ROLL's open-source uploader registry (file_system only), nor in roll",
            )
        if "output_dir" in value:
            self.set_path("checkpoint_dir", value["output_dir"], "checkpoint_config.output_dir")
            self.row(
                "checkpoint_config.output_dir",
                "implemented-as",
                "checkpoint_dir",
                "roll writes the checkpoints there (ROLL copies them there into a per-run timestamp folder)",
            )
        notes = {
            "type": "file_system: a folder",
            "async_upload": "roll writes checkpoints in place; nothing is uploaded",
            "keep_local_file": "roll keeps no second copy under output_dir",
        }
        for name in value:
            if name == "output_dir" or (name == "type" and kind != "file_system"):
                continue
            note = notes.get(name, "ROLL's file_system uploader takes and ignores it")
            self.row(f"checkpoint_config.{name}", "ignored", note=note)

    def track_with(self, value: Any) -> None:
        """ROLL's tracker names (roll/utils/tracking.py: tensorboard, wandb, stdout, swanlab, trackio); its
        ``create_tracker`` raises ValueError on any other name (ml_tracker is Alibaba's internal one)."""
        if value == "stdout":
            self.out["track_with"] = "console"
            self.row("track_with", "renamed", "track_with", "'stdout' -> 'console' (metrics printed per step)")
        elif isinstance(value, str) and value not in ("tensorboard", "wandb", "swanlab", "trackio", ""):
            note = (
                f"tracker {value!r} is not in ROLL's open-source tracker registry either (ROLL's create_tracker "
                f"raises 'Unknown tracker name'); use tensorboard, wandb, swanlab, trackio or stdout"
            )
            self.row("track_with", "unsupported", note=note)
        else:
            self.out["track_with"] = value
            self.row("track_with", "kept", "track_with")

    def train_infer_correction(self, value: Any) -> None:
        value = value or {}
        weight = value.get("is_weight") or {}
        if weight.get("enabled"):
            level = {"token": "token", "sequence": "sequence"}.get(weight.get("weight_type", "token"))
            if level is None:
                self.row(
                    "train_infer_correction.is_weight.weight_type",
                    "unsupported",
                    note=f"roll's truncated IS is per token or sequence, got {weight.get('weight_type')!r}",
                )
            else:
                self.out["tis_cap"] = weight.get("upper_bound") or 2.0
                self.out["tis_level"] = level
        filters = value.get("filters") or []
        if filters:
            self.set_path("correction.filters", [dict(f) if isinstance(f, dict) else f for f in filters], "filters")
        self.row(
            "train_infer_correction",
            "implemented-as",
            "correction.tis_cap/tis_level, correction.filters",
            "is_weight -> TIS; filters -> ratio/diff filters (same fields)",
        )

    # --- flat keys, with ROLL's value spellings -------------------------------------------------------------
    def flat_key(self, key: str, value: Any, data: dict[str, Any]) -> None:
        target = self.flat[key]
        note = ""
        if key == "adv_estimator" and value in UNSUPPORTED_ESTIMATORS and self.pipeline == "rlvr":
            self.row(key, "unsupported", target, f"estimator {value!r} is agentic (step-level); roll's RLVR lacks it")
            return
        if key == "dual_clip_loss":
            clip = data.get("pg_clip", 0.2)
            value = 1 + 2 * float(clip) if value is True else (None if value is False else value)
            note = "true: dual-clip bound 1 + 2 * pg_clip, as ROLL"
        elif key == "importance_sampling" and value == "seq":
            value, note = "sequence", "'seq' -> 'sequence'"
        elif key == "kl_penalty" and value == "full":
            note = "exact KL over the whole vocabulary per token (ROLL's own 'full' is broken: see docs/roll-compat.md)"
        elif key in ("pg_clip_low", "pg_clip_high") and not data.get("use_pg_clip_range", False):
            self.row(key, "ignored", note="used only with use_pg_clip_range: true, as in ROLL")
            return
        elif key == "target_kl" and value is not None and "kl_ctrl_type" not in data:
            self.out["kl_ctrl_type"] = "adaptive"
            self.out.setdefault("kl_horizon", data.get("kl_horizon", 10000))
            note = "set: adaptive KL controller, as ROLL"
        elif key == "batch_adjust_mode" and value not in ("copy", "delete", "none", "auto", "random_sample"):
            self.row(key, "unsupported", target, f"batch_adjust_mode {value!r}: not one of ROLL's modes")
            return
        elif key == "async_generation_ratio" and not value:
            self.row(key, "ignored", note=f"{value!r} is ROLL's default (synchronous); roll's default step is too")
            return
        elif key == "model_update_frequency" and key in self.out:
            self.row(key, "kept", target, "also given by a role")
        self.out[key] = value
        self.row(key, "mapped", target, note)


def translate(
    data: dict[str, Any],
    referenced: set[str] | None = None,
    pipeline: str | None = None,
    reason: str = "pipeline_cls given",
) -> Translation:
    """roll config data for ROLL config ``data`` (composed and interpolated) and a report row per key; ``pipeline``
    (with ``reason``, why it is that one) instead of the one inferred from ``data``."""
    from roll.pipelines.registry import resolve_pipeline

    name, why = (pipeline, reason) if pipeline else infer_pipeline(data)
    try:
        config_cls = resolve_pipeline(name).config_cls
    except ConfigError as e:
        raise ConfigError(f"this ROLL config is a {name} config ({why}), and {e}") from None
    translator = _Translator(config_cls, name, referenced or set())
    translator.run(data)
    rows = translator.rows
    markers = multimodal_markers(data)
    if markers:  # one reason instead of the keys that follow from it
        shown = "; ".join(markers[:3]) + (f"; and {len(markers) - 3} more" if len(markers) > 3 else "")
        note = f"roll has no multimodal (image, video or audio) pipeline; this file is multimodal: {shown}"
        rows = [row for row in rows if row.status not in ("unsupported", "unknown")]
        rows.append(KeyReport("(multimodal)", "unsupported", note=note))
    return Translation(translator.out, name, why, rows)
