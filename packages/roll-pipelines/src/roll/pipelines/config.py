"""Pipeline configuration: pipeline-wide fields plus one RoleConfig per role, loaded from YAML.

A pipeline class declares its config class (``config_cls``), so ``pipeline_cls`` in a YAML file selects both.
Precedence: command-line ``a.b=c`` overrides > the YAML file > field defaults. Validation reports every
problem at once, each with its field path, the bad value and how to fix it.
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from roll.pipelines.data import DataArgs
from roll.pipelines.recipes import recipe_path
from roll.pipelines.registry import resolve_pipeline
from roll.pipelines.tracking import check_tracker_names
from roll.runtime import ConfigError, RollModel
from roll.runtime.config import validation_error_lines
from roll.strategies import StrategyWorkerConfig

if TYPE_CHECKING:
    from roll.pipelines.compat import Translation

logger = logging.getLogger(__name__)

__all__ = [
    "FOLDER_FIX",
    "BaseConfig",
    "RoleConfig",
    "apply_overrides",
    "folder_problem",
    "load_config",
    "missing_reference",
    "move_flat_keys",
    "parse_overrides",
    "raw_section",
    "raw_value",
    "read_config_source",
    "read_yaml",
    "with_roll_overrides",
]


def missing_reference(switch: str) -> ValueError:
    """The error for a KL term that is on (``switch`` says which) in a config without a reference role."""
    return ValueError(
        f"{switch} but no reference role is configured: add `reference:` with actor_train's model_args and an "
        "inference strategy (hf_infer, fsdp2_infer, megatron_infer), or turn the KL off"
    )


class RoleConfig(StrategyWorkerConfig):
    """One role (cluster) of a pipeline: deployment, model, training, generation, data and backend settings."""

    data_args: DataArgs | None = None

    def require_data(self) -> DataArgs:
        """``data_args``, for a role whose pipeline needs data (its config checks that it is set)."""
        if self.data_args is None:
            raise ConfigError(f"{self.name}.data_args is required: set file_name (and eval_file_name)")
        return self.data_args


# --- raw data, before validation ------------------------------------------------------------------------------
# Derived values are written into the raw data before a config is built, never into a built config. These helpers
# copy every mapping they hand out, so the caller's data is never changed.
def _as_mapping(value: Any) -> dict[str, Any] | None:
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    return dict(value) if isinstance(value, dict) else None


def raw_section(data: dict[str, Any], *path: str, create: bool = False) -> dict[str, Any] | None:
    """The mapping at ``path`` in raw config ``data``, copied into place so it may be changed.

    None when a part of the path is absent (unless ``create``) or is not a mapping: validation reports that.
    """
    node = data
    for key in path:
        child = _as_mapping(node.get(key)) if key in node else ({} if create else None)
        if child is None:
            return None
        node[key] = child
        node = child
    return node


def raw_value(data: dict[str, Any], *path: str, default: Any = None) -> Any:
    """The value at ``path`` in raw config ``data`` (``default`` when absent); never changes ``data``."""
    node: Any = data
    for key in path:
        node = _as_mapping(node)
        if node is None or key not in node:
            return default
        node = node[key]
    return node


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def field_default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True)


def move_flat_keys(data: dict[str, Any], table: Mapping[str, str], sections: Iterable[str]) -> dict[str, Any]:
    """Move flat keys (``rollout_batch_size: 8``) to their section paths (``rollout.batch_size``) per ``table``.

    A key that names a section and holds a mapping is that section, not a flat key. A setting given both flat and in
    its section is an error naming both.
    """
    out = dict(data)
    section_names = set(sections)
    for flat, path in table.items():
        if flat not in out or (flat in section_names and isinstance(_as_mapping(out[flat]), dict)):
            continue
        value = out.pop(flat)
        *parents, leaf = path.split(".")
        node = raw_section(out, *parents, create=True)
        if node is None:
            raise ValueError(f"{flat} moves to {path}, but {'.'.join(parents)} is not a section; fix that section")
        if leaf in node:
            raise ValueError(f"{flat} and {path} are the same setting and both are set; keep only {path}")
        node[leaf] = value
    return out


def _role_model(annotation: Any) -> tuple[type[RoleConfig], bool] | None:
    """(role class, is a dict of roles) for a field annotated with a RoleConfig, an optional one or a dict of them."""
    if isinstance(annotation, type) and issubclass(annotation, RoleConfig):
        return annotation, False
    args = get_args(annotation)
    if get_origin(annotation) is dict and len(args) == 2:
        inner = _role_model(args[1])
        return (inner[0], True) if inner is not None and not inner[1] else None
    for arg in args:  # Optional[RoleConfig] / RoleConfig | None
        found = _role_model(arg)
        if found is not None:
            return found
    return None


def folder_problem(path: Path) -> str | None:
    """Why folder ``path`` could not be made and written here (its nearest existing path is a file, or a folder
    this process cannot write), or None."""
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} cannot be written on this machine"
    return None


FOLDER_FIX = {
    "output_dir": "set output_dir to a folder this machine can write",
    "checkpoint_dir": "set checkpoint_dir (checkpoint_config.output_dir in a ROLL file) to a folder this machine can write",
}


class BaseConfig(RollModel):
    """Fields every pipeline has. Subclasses add their roles (RoleConfig fields) and sections of algorithm settings.

    Before validation, raw data goes through :meth:`normalize` (flat keys of ``flat_keys`` moved into their
    sections) and :meth:`derive_defaults` (values that follow from other fields: role names, the pipeline-wide
    ``system_envs``, LR schedule lengths...). Nothing changes a config after it is built.
    """

    # flat key -> "section.field": ROLL-style flat settings accepted and moved into their sections
    flat_keys: ClassVar[Mapping[str, str]] = {}

    pipeline_cls: str = Field(description="Pipeline name (sft, dpo, rlvr, rlvr_rollout) or 'package.module:Class'.")
    exp_name: str = "roll"
    seed: int = 42
    output_dir: str = Field(default="./output/{exp_name}", description="'{exp_name}' is replaced by exp_name.")
    checkpoint_dir: str | None = Field(
        default=None,
        description="Where checkpoints go (null: output_dir/checkpoints); '{exp_name}' is replaced by exp_name.",
    )
    max_steps: int = Field(default=100, ge=1)
    save_steps: int = Field(default=0, ge=0, description="Checkpoint every N steps (0: only at the end).")
    eval_steps: int = Field(default=0, ge=0, description="Validate every N steps (0: never, except at the end).")
    logging_steps: int = Field(default=1, ge=1)
    max_ckpt_to_keep: int = Field(default=2, ge=1)
    resume_from_checkpoint: bool | str = Field(default=False, description="false, 'auto' (latest) or a path.")
    track_with: list[str] = Field(default_factory=lambda: ["console"], description="Besides metrics.jsonl (always).")
    tracker_kwargs: dict[str, Any] = Field(default_factory=dict)
    num_nodes: int | None = Field(default=None, ge=1)
    num_gpus_per_node: int | None = Field(default=None, ge=0)
    system_envs: dict[str, str] = Field(default_factory=dict, description="Environment variables for every role.")
    export_hf: bool = Field(default=True, description="Save the trained model in HF format at the end.")
    plots: bool = Field(default=True, description="Write plots/*.png of the main curves at the end.")

    @model_validator(mode="before")
    @classmethod
    def _prepare_raw(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return cls.derive_defaults(cls.normalize(data))

    @classmethod
    def normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with its flat keys moved into their sections (a copy; idempotent)."""
        return move_flat_keys(data, cls.flat_keys, cls.model_fields)

    @classmethod
    def derive_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Fill values that follow from other fields into normalized raw ``data`` (a copy; idempotent).

        Here: each role's ``name`` (its field name, ``field_key`` for roles in a dict) and ``system_envs`` (the
        pipeline's, overridden by the role's own). Subclasses add theirs and call ``super().derive_defaults``.
        """
        data = dict(data)
        shared = _as_mapping(data.get("system_envs")) or {}
        for field_name, role in cls._raw_roles(data).items():
            if role.get("name") in (None, "worker"):
                role["name"] = field_name.replace(".", "_")
            own = _as_mapping(role.get("system_envs"))
            if own is not None or shared:
                role["system_envs"] = {**shared, **(own or {})}
        return data

    @classmethod
    def _raw_roles(cls, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Role sections of raw ``data`` by role name (``field`` or ``field.key``), copied into place."""
        found: dict[str, dict[str, Any]] = {}
        for name, info in cls.model_fields.items():
            kind = _role_model(info.annotation)
            section = raw_section(data, name) if kind is not None and data.get(name) is not None else None
            if section is None:
                continue
            if not kind[1]:  # type: ignore[index]
                found[name] = section
                continue
            for key in list(section):
                role = raw_section(section, key)
                if role is not None:
                    found[f"{name}.{key}"] = role
        return found

    @classmethod
    def fill_schedule_length(cls, data: dict[str, Any], role: str, updates_per_step: Any) -> None:
        """Give ``role``'s LR schedule its length, unless set: ``max_steps * updates_per_step`` optimizer steps."""
        max_steps = data.get("max_steps", field_default(cls, "max_steps"))
        if not (is_int(max_steps) and is_int(updates_per_step)) or raw_section(data, role) is None:
            return  # validation reports the bad value or the missing role
        args = raw_section(data, role, "training_args", create=True)
        if args is not None and args.get("max_steps") is None:
            args["max_steps"] = max_steps * updates_per_step

    @field_validator("track_with", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("track_with")
    @classmethod
    def _check_trackers(cls, value: list[str]) -> list[str]:
        try:
            check_tracker_names(value)
        except ConfigError as e:
            raise ValueError(str(e).removeprefix("track_with: ")) from None
        return value

    @field_validator("resume_from_checkpoint")
    @classmethod
    def _check_resume(cls, value: bool | str) -> bool | str:
        if value is True:
            return "auto"
        return value

    @model_validator(mode="after")
    def _check_role_names(self) -> BaseConfig:
        names = [role.name for role in self.roles().values()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"role names {duplicates} are used twice; give each role a unique `name`")
        return self

    @property
    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.replace("{exp_name}", self.exp_name)).expanduser()

    @property
    def resolved_checkpoint_dir(self) -> Path:
        if self.checkpoint_dir is None:
            return self.resolved_output_dir / "checkpoints"
        return Path(self.checkpoint_dir.replace("{exp_name}", self.exp_name)).expanduser()

    def deployment_checks(self) -> list[Callable[[], str | None]]:
        """Pipeline-specific checks for ``roll validate`` (each returns a summary line or None, raises a RollError
        for a problem); none by default."""
        return []

    def roles(self) -> dict[str, RoleConfig]:
        """The configured roles by field name; roles in a dict field (e.g. reward domains) as ``field.key``.

        Unset optional roles are skipped.
        """
        out: dict[str, RoleConfig] = {}
        for name, value in self:
            if isinstance(value, RoleConfig):
                out[name] = value
            elif isinstance(value, dict):
                out.update({f"{name}.{key}": role for key, role in value.items() if isinstance(role, RoleConfig)})
        return out


# --- loading ------------------------------------------------------------------------------------------------
def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must contain a mapping of config fields, got {type(data).__name__}")
    return data


def parse_overrides(overrides: list[str]) -> list[tuple[list[str], Any]]:
    """``["a.b=1", "c=[x, y]"]`` -> ``[(["a", "b"], 1), (["c"], ["x", "y"])]`` (values parsed as YAML)."""
    parsed = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like field.path=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        parsed.append((key.strip().split("."), value))
    return parsed


def _override_path(path: list[str], value: Any, flat_keys: Mapping[str, str]) -> list[str]:
    """The section path an override of a flat key lands on (``rollout_batch_size`` -> ``rollout.batch_size``)."""
    target = flat_keys[path[0]].split(".") if path[0] in flat_keys else None
    if target is None:
        return path
    if target[0] == path[0] and (len(path) > 1 or isinstance(value, dict)):
        return path  # the key names its section (dynamic_sampling.enabled=true), not the flat setting
    return [*target, *path[1:]]


def apply_overrides(
    data: dict[str, Any], overrides: list[str], flat_keys: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``data`` with ``a.b=value`` overrides applied (in place). An override of one of ``flat_keys`` lands on its
    section path, so ``rollout_batch_size=8`` replaces the file's ``rollout.batch_size``."""
    for path, value in parse_overrides(overrides):
        path = _override_path(path, value, flat_keys or {})
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {'.'.join(path)}: {part!r} is not a section (it is {child!r})")
            node = child
        node[path[-1]] = value
    return data


def _field_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None or get_args(annotation):
        for arg in get_args(annotation):
            found = _field_model(arg)
            if found is not None:
                return found
    return None


def _suggestion(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """'did you mean ...?' for an unknown field at ``loc``."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return ""
        current = _field_model(current.model_fields[part].annotation)
    if current is None:
        return ""
    known = list(current.model_fields)
    if current is model and isinstance(model, type) and issubclass(model, BaseConfig):
        known += list(model.flat_keys)  # ROLL-style flat spellings are accepted at the top level too
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def validate_config(config_cls: type[BaseConfig], data: dict[str, Any], source: str) -> BaseConfig:
    """Build ``config_cls`` from ``data``; one ConfigError listing every problem (with typo suggestions)."""
    try:
        return config_cls.validate_raw(data)
    except ValidationError as e:
        lines = []
        for line, item in zip(validation_error_lines(e), e.errors()):
            hint = _suggestion(config_cls, item["loc"]) if item["type"] == "extra_forbidden" else ""
            lines.append(f"  {line}{hint}")
        count = len(lines)
        raise ConfigError(
            f"{source}: {count} configuration error{'s' if count != 1 else ''}:\n" + "\n".join(lines)
        ) from None


def _lacks_field(annotation: Any, name: str) -> bool:
    """Whether ``annotation`` is a config model without a field (or alias) ``name``."""
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return False
    aliases = {a for f in annotation.model_fields.values() for a in _field_aliases(f)}
    return name not in annotation.model_fields and name not in aliases


def _field_aliases(field: Any) -> set[str]:
    alias = field.validation_alias
    if isinstance(alias, str):
        return {alias}
    if alias is not None and hasattr(alias, "choices"):
        return {c for c in alias.choices if isinstance(c, str)}
    return {field.alias} if isinstance(field.alias, str) else set()


def read_config_source(
    source: str | Path | dict[str, Any], overrides: list[str] | None = None
) -> tuple[dict[str, Any], str, Translation | None]:
    """(roll config data, label, the ROLL translation if the source was a ROLL config) of a file, recipe or dict.

    Files are composed Hydra-style (``defaults:``, ``${...}``, ``hydra:`` removed). A config that names no
    ``pipeline_cls`` is a ROLL config: its pipeline is inferred from its shape (a ``pipeline_cls=`` override wins)
    and its keys translated; an unsupported or unknown key is one ConfigError listing every such key. Overrides of
    a ROLL file that name ROLL keys (``pretrain=...``, an interpolated ``max_actions_per_traj=5``) are applied to the
    file before its ``${...}`` are resolved and it is translated, as Hydra does, and so are overrides of flat keys
    (``dual_clip_loss=true``, ``target_kl=0.05``: ROLL's keys, whose values take ROLL's meaning as the file's own do);
    they are listed in the translation's ``applied_overrides``. The others name roll's fields and are applied by
    :func:`load_config`.
    """
    from roll.pipelines.compat import compose_file, interpolate, is_roll_format, referenced_keys, translate
    from roll.pipelines.compat.defaults import DERIVED_FROM

    overrides = list(overrides or [])
    forced = next((value for path_, value in parse_overrides(overrides) if path_ == ["pipeline_cls"]), None)
    applied: list[str] = []
    inferred: list[tuple[str, str]] = []

    def apply_roll_overrides(composed: dict[str, Any]) -> None:
        if not overrides or not is_roll_format(composed):
            return
        from roll.pipelines.compat import infer_pipeline

        # the file's own shape picks the pipeline: an override that adds a role (actor_train=...) does not
        inferred[:] = [(str(forced), "pipeline_cls given")] if forced is not None else [infer_pipeline(composed)]
        config_cls = resolve_pipeline(inferred[0][0]).config_cls
        referenced = referenced_keys(composed)
        early = []
        for item, (path, value) in zip(overrides, parse_overrides(overrides), strict=True):
            field = config_cls.model_fields.get(path[0])
            # a flat key is ROLL's key: its value takes ROLL's meaning (dual_clip_loss=true, target_kl=...)
            flat = _override_path(path, value, config_cls.flat_keys) != path
            known = field is not None or path[0] in config_cls.flat_keys
            role = field is not None and _role_model(field.annotation) is not None
            derived = len(path) == 1 and path[0] in DERIVED_FROM  # the translation writes values from it
            # a section roll has too, but a key under it that only ROLL's has (validation.data_args.file_name)
            foreign = field is not None and len(path) > 1 and _lacks_field(field.annotation, path[1])
            if not known or role or flat or derived or foreign or path[0] in referenced:
                early.append(item)
                if not known or role or flat or foreign:  # translated with the file; a referenced roll field is
                    applied.append(item)  # applied again
        apply_overrides(composed, early)

    if isinstance(source, dict):
        data, label, referenced = interpolate(dict(source)), "<dict>", referenced_keys(source)
    else:
        path = Path(source)
        if not path.suffix and not path.exists():
            path = recipe_path(str(source))
        data, referenced = compose_file(path, apply_roll_overrides)
        label = str(path)
    if not is_roll_format(data):
        return data, label, None
    if inferred:
        translation = translate(data, referenced, pipeline=inferred[0][0], reason=inferred[0][1])
    else:
        translation = translate(data, referenced, pipeline=str(forced) if forced is not None else None)
    translation.applied_overrides = applied
    return translation.data, label, translation


def load_config(source: str | Path | dict[str, Any], overrides: list[str] | None = None) -> BaseConfig:
    """Load a YAML file (roll's or ROLL's format), a built-in recipe name or a dict; apply overrides; validate with
    the pipeline's config."""
    overrides = list(overrides or [])
    data, label, translation = read_config_source(source, overrides)
    if translation is not None:
        translation.raise_problems(label)
        ignored = [row.key for row in translation.rows if row.status == "ignored"]
        logger.info(
            "%s is a ROLL config: pipeline %s (%s); %d key(s) ignored (see `roll convert %s`)",
            label,
            translation.pipeline,
            translation.reason,
            len(ignored),
            label,
        )
    name = next((value for path, value in parse_overrides(overrides) if path == ["pipeline_cls"]), None)
    name = name if name is not None else data.get("pipeline_cls")
    if name is None:
        raise ConfigError(
            f"{label}: pipeline_cls is missing; set it to sft, dpo, rlvr, rlvr_rollout or 'pkg.module:Class'"
        )
    config_cls: type[BaseConfig] = resolve_pipeline(str(name)).config_cls
    try:
        data = with_roll_overrides(data, overrides, translation, config_cls)
    except ValueError as e:
        raise ConfigError(f"{label}: {e}") from None
    return validate_config(config_cls, data, label)


def with_roll_overrides(
    data: dict[str, Any],
    overrides: list[str],
    translation: Translation | None,
    config_cls: type[BaseConfig] | None = None,
) -> dict[str, Any]:
    """``data`` (from :func:`read_config_source`) normalized, with the ``overrides`` that name roll's own fields (the
    ones the ROLL translation did not take) applied: what :func:`load_config` validates and ``roll convert`` prints.
    ``config_cls`` defaults to the translation's pipeline's."""
    if config_cls is None:
        if translation is None:
            raise ValueError("with_roll_overrides needs a config class or a translation")
        config_cls = resolve_pipeline(translation.pipeline).config_cls
    todo = [item for item in overrides if item not in (translation.applied_overrides if translation else [])]
    # A key the file spells as ROLL does and normalizing renames (student_train for actor_train, ROLL's dict of
    # teachers) takes its overrides before the renaming, where the file's own key is (student_train.x=...).
    renamed = set(data) - set(config_cls.normalize(copy.deepcopy(data))) - set(config_cls.flat_keys)
    early = [item for item, (path, _) in zip(todo, parse_overrides(todo), strict=True) if path[0] in renamed]
    data = config_cls.normalize(apply_overrides(data, early))
    # flat keys were folded into their sections first: an override of a flat key replaces its section field
    return apply_overrides(data, [item for item in todo if item not in early], config_cls.flat_keys)
