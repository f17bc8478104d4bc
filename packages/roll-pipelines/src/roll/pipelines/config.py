"""Pipeline configuration: pipeline-wide fields plus one RoleConfig per role, loaded from YAML.

A pipeline class declares its config class (``config_cls``), so ``pipeline_cls`` in a YAML file selects both.
Precedence: command-line ``a.b=c`` overrides > the YAML file > field defaults. Validation reports every
problem at once, each with its field path, the bad value and how to fix it.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from roll.pipelines.data import DataArgs
from roll.runtime import ConfigError, RollModel
from roll.runtime.config import validation_error_lines
from roll.strategies import StrategyWorkerConfig

__all__ = ["BaseConfig", "RoleConfig", "apply_overrides", "load_config", "parse_overrides", "read_yaml"]


class RoleConfig(StrategyWorkerConfig):
    """One role (cluster) of a pipeline: deployment, model, training, generation, data and backend settings."""

    data_args: DataArgs | None = None


class BaseConfig(RollModel):
    """Fields every pipeline has. Subclasses add their roles (RoleConfig fields) and algorithm settings."""

    pipeline_cls: str = Field(description="Pipeline name (sft, dpo, rlvr, rlvr_rollout) or 'package.module:Class'.")
    exp_name: str = "roll"
    seed: int = 42
    output_dir: str = Field(default="./output/{exp_name}", description="'{exp_name}' is replaced by exp_name.")
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

    @field_validator("track_with", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("resume_from_checkpoint")
    @classmethod
    def _check_resume(cls, value: bool | str) -> bool | str:
        if value is True:
            return "auto"
        return value

    @model_validator(mode="after")
    def _name_roles(self) -> BaseConfig:
        for field_name, role in self.roles().items():
            if role.name == "worker":
                object.__setattr__(role, "name", field_name.replace(".", "_"))
            merged = {**self.system_envs, **role.system_envs}
            object.__setattr__(role, "system_envs", merged)
        names = [role.name for role in self.roles().values()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"role names {duplicates} are used twice; give each role a unique `name`")
        return self

    @property
    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.replace("{exp_name}", self.exp_name)).expanduser()

    def fill_training_steps(self, *roles: RoleConfig, updates_per_step: int = 1) -> None:
        """Give LR schedules their length: optimizer steps = ``max_steps * updates_per_step`` unless set."""
        for role in roles:
            if role.training_args.max_steps is None:
                object.__setattr__(role.training_args, "max_steps", self.max_steps * updates_per_step)

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


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for path, value in parse_overrides(overrides):
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
    close = difflib.get_close_matches(str(loc[-1]), list(current.model_fields), n=1)
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


def load_config(source: str | Path | dict[str, Any], overrides: list[str] | None = None) -> BaseConfig:
    """Load a YAML file, a built-in recipe name or a dict; apply overrides; validate with the pipeline's config."""
    from roll.pipelines.recipes import recipe_path
    from roll.pipelines.registry import resolve_pipeline

    if isinstance(source, dict):
        data, label = dict(source), "<dict>"
    else:
        path = Path(source)
        if not path.suffix and not path.exists():
            path = recipe_path(str(source))
        data, label = read_yaml(path), str(path)
    data = apply_overrides(data, list(overrides or []))
    if "pipeline_cls" not in data:
        raise ConfigError(
            f"{label}: pipeline_cls is missing; set it to sft, dpo, rlvr, rlvr_rollout or 'pkg.module:Class'"
        )
    pipeline_cls = resolve_pipeline(str(data["pipeline_cls"]))
    return validate_config(pipeline_cls.config_cls, data, label)
