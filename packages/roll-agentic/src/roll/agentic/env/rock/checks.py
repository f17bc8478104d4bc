"""``roll validate`` checks of ``rock_tb_native_env`` entries: the SDK, the agent config, the task file, the test
folders and the ROCK service.

What depends on this machine (rl-rock not installed, the task file or a test folder not here, the service not
answering) raises MissingExtraError / DataNotFoundError / ServiceUnreachableError, which ``roll validate --no-ray``
reports as warnings; a bad ``agent_config`` (ROCK's own ``RockAgentConfig`` refuses it) is a ConfigError.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from roll.agentic.env.rock.config import RockEnvConfig, TaskSet
from roll.agentic.env.rock.env import check_env_config
from roll.runtime import ConfigError, import_extra
from roll.runtime.config import validation_error_lines

__all__ = ["ROCK_ENV_TYPE", "rock_checks"]

ROCK_ENV_TYPE = "rock_tb_native_env"
PING_TIMEOUT_S = 3.0


def _check_agent(tag: str, config: RockEnvConfig) -> str:
    rock_agent = import_extra(
        "rock.sdk.sandbox.agent.rock_agent", "rock_tb_native_env (ROCK sandboxes)", "roll-agentic", "rock"
    )
    try:
        rock_agent.RockAgentConfig(**config.rock_agent_config())
    except ValidationError as e:
        listed = "; ".join(validation_error_lines(e, root=f"custom_envs.{tag}.env_config.agent_config"))
        raise ConfigError(f"ROCK refuses the agent config: {listed}") from None
    return f"{tag}: ROCK agent config accepted (agent_type {config.agent_config['agent_type']!r})"


def _check_tasks(tag: str, config: RockEnvConfig) -> str:
    from roll.pipelines.data.sources import DataNotFoundError

    try:
        tasks = TaskSet(config)
    except DataNotFoundError as e:
        raise DataNotFoundError(f"custom_envs.{tag}.{e}") from None
    missing = [folder for folder in config.test_files if not Path(folder).is_dir()]
    if missing:
        raise DataNotFoundError(f"custom_envs.{tag}.env_config.test_files: {missing} are not folders on this machine")
    return f"{tag}: {len(tasks.rows)} task(s) in {config.dataset_name} ({config.mode})"


def _check_service(url: str) -> str:
    from roll.pipelines.validate import ping_service

    ping_service(url, f"ROCK service {url}", "start it or fix sandbox_base_url", timeout_s=PING_TIMEOUT_S)
    return f"ROCK service {url}: answers"


def rock_checks(custom_envs: Mapping[str, Any]) -> list[Callable[[], str | None]]:
    """One check per thing to check of the ``rock_tb_native_env`` entries of ``custom_envs`` (each service once)."""
    checks: list[Callable[[], str | None]] = []
    urls: set[str] = set()
    for tag, spec in custom_envs.items():
        if spec.env_type != ROCK_ENV_TYPE:
            continue
        config = check_env_config(spec.env_config)
        checks.append(functools.partial(_check_agent, tag, config))
        checks.append(functools.partial(_check_tasks, tag, config))
        if config.sandbox_base_url not in urls:
            urls.add(config.sandbox_base_url)
            checks.append(functools.partial(_check_service, config.sandbox_base_url))
    return checks
