"""``roll validate``: check a config's references and device mapping without starting any worker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from roll.pipelines.config import BaseConfig
from roll.runtime import ConfigError

__all__ = ["validate_deployment"]


def _check_model_ref(role: str, field: str, value: str | None) -> None:
    if not value:
        return
    if value.startswith("tiny://"):
        from roll.strategies.testing import TINY_PRESETS

        preset = urlparse(value).netloc or "nano"
        if preset not in TINY_PRESETS:
            raise ConfigError(
                f"{role}.model_args.{field}={value!r}: unknown tiny preset; use one of {sorted(TINY_PRESETS)}"
            )
    elif value.startswith("recipe://"):
        from roll.pipelines.recipes import recipe_path

        recipe_path(urlparse(value).netloc)
    elif "://" in value:
        from roll.pipelines.assets import MODEL_SCHEMES

        if value.partition("://")[0] not in MODEL_SCHEMES:
            raise ConfigError(
                f"{role}.model_args.{field}={value!r}: unknown scheme; use one of {sorted(MODEL_SCHEMES)}"
            )
    elif not Path(value).expanduser().exists():
        raise ConfigError(
            f"{role}.model_args.{field}={value!r} does not exist; give a local HF folder or tiny://<preset>"
        )


def _check_data_ref(role: str, field: str, value: object) -> None:
    values = value if isinstance(value, list) else [value]
    for item in values:
        if not item or not isinstance(item, str) or item.startswith("synthetic://"):
            continue
        if not Path(item).expanduser().is_file():
            raise ConfigError(f"{role}.data_args.{field}: file {item!r} does not exist")


def validate_deployment(config: BaseConfig, *, check_ray: bool = True) -> list[str]:
    """Raise ConfigError on the first unusable reference or device mapping; return a summary per role.

    Without ``check_ray`` (``roll validate --no-ray``: checking a config away from the machine it runs on), a model
    or data file that is not here is a warning line, not an error.
    """
    lines = []
    for name, role in config.roles().items():
        checks: list[tuple[Callable[[str, str, Any], None], str, Any]] = [
            (_check_model_ref, "model_name_or_path", role.model_args.model_name_or_path),
            (_check_model_ref, "tokenizer_name_or_path", role.model_args.tokenizer_name_or_path),
        ]
        if role.data_args is not None:
            checks.append((_check_data_ref, "file_name", role.data_args.file_name))
            checks.append((_check_data_ref, "eval_file_name", getattr(role.data_args, "eval_file_name", None)))
        for check, field, value in checks:
            try:
                check(name, field, value)
            except ConfigError as e:
                if check_ray:
                    raise
                lines.append(f"warning: {e} (not checked further: --no-ray)")
        backend = role.strategy_args.strategy_name if role.strategy_args else "-"
        placement = f"devices {role.device_mapping}" if role.device_mapping is not None else "CPU"
        lines.append(f"{name}: {role.world_size} worker(s), {backend}, {placement}")
    if check_ray:
        from roll.runtime import ResourceManager, init

        info = init()
        manager = ResourceManager(num_nodes=config.num_nodes, num_gpus_per_node=config.num_gpus_per_node)
        for role in config.roles().values():
            manager.validate(role)
        lines.append(f"Ray: {len(manager.nodes)} node(s), {manager.total_devices} device(s), {info.num_cpus:g} CPUs")
    return lines
