"""Settings of ``rock_tb_native_env`` (ROLL's ``RockTBNativeEnv`` keyword arguments) and its task file.

The keys and defaults are ROLL's (``roll/pipeline/agentic/env/sandbox/rock_tb_native_env.py``), except
``sandbox_base_url``, whose ROLL default is an internal Alibaba address (ours: a ROCK service on this machine). Keys
that ROLL accepts but never reads are accepted at their default only; setting one is an error naming it.
``agent_config`` is ROCK's own agent configuration (``RockAgentConfig`` of rl-rock: ``agent_type``, ``run_cmd``,
``pre_init_cmds``, ``env``, ``runtime_env_config``, ``model_service_config``, ...): it is handed to ROCK's SDK,
which checks it when the env is built.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from roll.runtime import ConfigError, RollModel

__all__ = ["ROLL_UNREAD_KEYS", "RockEnvConfig", "TaskSet", "parse_idx_range"]

# ROLL's RockTBNativeEnv stores these and never reads them: accepted at their default, refused otherwise.
ROLL_UNREAD_KEYS: dict[str, Any] = {
    "max_execute_time": 60 * 50,
    "pass_low_threshold": 0.0,
    "pass_high_threshold": 0.0,
    "group_key": None,
    "seed": 0,
    "run_region": "",
    "run_region_key": "run_region",
    "tools": None,
}


def parse_idx_range(value: Any, key: str) -> list[int]:
    """ROLL's ``train_idx_range`` / ``val_idx_range``: ``[start, end]`` (both included), a list of task ids, or a
    ``"list(range(a, b))"`` / ``"range(a, b)"`` string."""
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        for prefix in ("list(range(", "range("):
            if text.startswith(prefix):
                inner = text[len(prefix) :].rstrip(")")
                try:
                    return list(range(*(int(part) for part in inner.split(","))))
                except (TypeError, ValueError):
                    break
        raise ConfigError(f"env_config.{key}={value!r}: use [start, end], a list of ids, or 'list(range(a, b))'")
    items = list(value)
    if len(items) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return list(range(int(items[0]), int(items[1]) + 1))
    try:
        return [int(x) for x in items]
    except (TypeError, ValueError):
        raise ConfigError(f"env_config.{key}={value!r}: task ids must be integers") from None


class RockEnvConfig(RollModel):
    """``env_config`` of a ``rock_tb_native_env`` entry (ROLL's keys)."""

    exp_mode: Literal["train", "eval_gt"] = Field(
        default="train", description="'eval_gt' runs the task's solution.sh instead of the agent (checks the task)."
    )
    mode: Literal["train", "val"] = Field(
        default="train", description="'train' draws a task per seed at random; 'val' walks the tasks in order."
    )
    group_id: int = 0
    num_env_groups: int = Field(default=1, ge=1)
    max_steps: int = Field(default=80, ge=1, description="Most model turns per episode (then the tests run).")
    sandbox_base_url: str = Field(default="http://localhost:8080", description="The ROCK service.")
    xrl_authorization: str = Field(default="", description="Sent as the XRL-Authorization header when set.")
    user_id: str = "0000"
    experiment_id: str = "test"
    auto_clear_seconds: int = Field(default=3600, gt=0, description="ROCK reclaims a sandbox left this long.")
    startup_timeout: float = Field(default=600, gt=0, description="Seconds for the sandbox to start.")
    timeout: float = Field(default=300, gt=0, description="Seconds for one sandbox command (start script, setup).")
    agent_timeout_sec: int = Field(default=2400, gt=0, description="exp_mode eval_gt: seconds for solution.sh.")
    test_timeout_sec: int = Field(default=600, gt=0, description="Seconds for the task's run-tests.sh.")
    max_env_time: float = Field(
        default=3000, gt=0, description="Wall seconds per episode; past it the next turn ends the episode (tests run)."
    )
    debug: bool = Field(default=False, description="Leave the sandbox running after the episode (ROLL's debug).")
    agent_config: dict[str, Any] = Field(description="ROCK's agent configuration (RockAgentConfig of rl-rock).")
    max_multi_session_num: int = Field(
        default=1, ge=1, description="Agent sessions per episode; a new one starts with the test output as prompt."
    )
    dataset_name: str = Field(description="JSON-lines (or JSON list) file of tasks.")
    train_idx_range: Any = Field(default=(0, 10_000), description="Task ids (id_key) of mode train.")
    val_idx_range: Any = Field(default=(0, 10_000), description="Task ids (id_key) of mode val.")
    id_key: str = "id"
    question_key: str = "prompt"
    sandbox_image_key: str = "sandbox_image"
    task_name_key: str = "task_name"
    start_script_key: str = "start_script"
    tag_key: str = "tag"
    test_files: list[str] = Field(
        default_factory=list, description="Folders holding <task_name>/run-tests.sh and <task_name>/tests/."
    )
    # ROLL keys it never reads (see ROLL_UNREAD_KEYS).
    max_execute_time: float = 60 * 50
    pass_low_threshold: float = 0.0
    pass_high_threshold: float = 0.0
    group_key: str | None = None
    seed: int = 0
    run_region: str = ""
    run_region_key: str = "run_region"
    tools: Any = None
    sandbox_cls: str = Field(
        default="roll.agentic.env.rock.sandbox:RockSandbox",
        description="roll: the sandbox client class (import path); tests put a fake here.",
    )

    @field_validator("agent_config")
    @classmethod
    def _agent_config(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value.get("agent_type"):
            raise ValueError("agent_config.agent_type is required (ROCK's agent type, e.g. 'default')")
        run_cmd = value.get("run_cmd")
        if run_cmd is not None and not isinstance(run_cmd, str):
            raise ValueError(f"agent_config.run_cmd must be a string (got {run_cmd!r:.60})")
        return value

    @model_validator(mode="after")
    def _unread(self) -> RockEnvConfig:
        for key, default in ROLL_UNREAD_KEYS.items():
            if getattr(self, key) != default:
                raise ValueError(
                    f"env_config.{key}={getattr(self, key)!r}: ROLL's rock_tb_native_env accepts this key but never "
                    f"reads it, and neither does roll; remove it (or leave it at {default!r})"
                )
        for key in ("train_idx_range", "val_idx_range"):
            parse_idx_range(getattr(self, key), key)
        return self

    def rock_agent_config(self) -> dict[str, Any]:
        """``agent_config`` for ROCK's SDK: ROLL's ``<<PROMPT>>`` placeholder becomes ROCK's ``${prompt}``."""
        config = dict(self.agent_config)
        if isinstance(config.get("run_cmd"), str):
            config["run_cmd"] = config["run_cmd"].replace("<<PROMPT>>", "${prompt}")
        return config


class TaskSet:
    """The tasks of ``dataset_name`` whose id is in the mode's index range.

    ROLL shares one dataset actor between envs: 'sample' in train, 'traversal' in val. Here in train a seed draws a
    task at random (same seed, same task: a group's envs play one task); in val each new seed takes the next task in
    file order (wrapping around) and a seed seen before gets its task again, from a cursor shared by the envs of one
    process (env workers on Ray have one cursor each, so their val tasks may overlap).
    """

    _cursors: ClassVar[dict[tuple[str, tuple[int, ...]], dict[int, int]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, config: RockEnvConfig) -> None:
        from roll.pipelines.data.sources import DataNotFoundError

        path = Path(config.dataset_name).expanduser()
        if not path.is_file():
            raise DataNotFoundError(
                f"env_config.dataset_name={config.dataset_name!r}: no such task file on this machine (a JSON-lines "
                f"file with {config.id_key!r}, {config.question_key!r}, {config.sandbox_image_key!r} and "
                f"{config.task_name_key!r} per task)"
            )
        rows = _read_rows(path)
        key = "val_idx_range" if config.mode == "val" else "train_idx_range"
        wanted = set(parse_idx_range(getattr(config, key), key))
        required = (config.id_key, config.question_key, config.sandbox_image_key, config.task_name_key)
        for i, row in enumerate(rows):
            missing = [k for k in required if k not in row]
            if missing:
                raise ConfigError(f"{path}: task {i} has no {missing} (set env_config's *_key to its field names)")
        self.rows = [row for row in rows if _int_id(row[config.id_key], path) in wanted]
        if not self.rows:
            raise ConfigError(f"{path}: no task has an {config.id_key!r} in env_config.{key}")
        self.mode = config.mode
        self.key = (str(path.resolve()), tuple(sorted(wanted)))

    def pick(self, seed: int) -> dict[str, Any]:
        if self.mode == "val":
            with self._lock:
                seen = self._cursors.setdefault(self.key, {})
                index = seen.setdefault(seed, len(seen))
            return self.rows[index % len(self.rows)]
        return self.rows[random.Random(seed).randrange(len(self.rows))]


def _int_id(value: Any, path: Path) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: task id {value!r} is not an integer (ROLL filters tasks by integer ids)") from None


def _read_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{n}: not a JSON line ({e})") from None
    if not all(isinstance(row, dict) for row in rows):
        raise ConfigError(f"{path}: every task must be a JSON object")
    return rows
