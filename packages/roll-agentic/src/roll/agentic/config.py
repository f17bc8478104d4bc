"""Configuration of agentic rollouts, with ROLL's key names.

* ``custom_envs: {tag: CustomEnvConfig}``: what each env tag is (env type and its ``env_config``), its turn and
  token limits, prompt templates and env manager (trajectory-wise ``traj`` or step-wise ``step``).
* ``train_env_manager`` / ``val_env_manager``: :class:`EnvManagerConfig`, the EnvironmentWorker role:
  ``num_env_groups`` groups of ``group_size`` envs sharing a seed, spread over ``tags`` by
  ``num_groups_partition``, ``max_env_num_per_worker`` envs per worker.
* ``reward_normalization``: :class:`RewardNormalizationConfig` (``grouping`` column and ``method``).
"""

from __future__ import annotations

import difflib
import string
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from roll.runtime import ConfigError, RollModel, WorkerConfig
from roll.strategies import GenerationConfig

__all__ = [
    "DEFAULT_AGENT_TEMPLATE",
    "DEFAULT_STEP_AGENT_TEMPLATE",
    "DEFAULT_SYSTEM_TEMPLATE",
    "ENV_MANAGER_ALIASES",
    "CustomEnvConfig",
    "EnvManagerConfig",
    "LLMProxyConfig",
    "RewardNormalizationConfig",
    "ToolConfig",
    "ToolWrapperConfig",
    "is_step_manager",
    "spread_parse_tool_call",
    "spread_system_envs",
]

DEFAULT_SYSTEM_TEMPLATE = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in the game."
)
DEFAULT_AGENT_TEMPLATE = (
    "Turn {turn_idx}:\nObservation:\n{observation}\nYou have {actions_left} actions left. "
    "Answer in the format <answer>[your action]</answer>, in at most {max_response_length} tokens.\n"
    "Decide the next action:"
)
DEFAULT_STEP_AGENT_TEMPLATE = (
    "## Env Instruction: {env_instruction}\n\n## State Description:\nPrior to this step, you have completed "
    "{step_count} steps. Recent history (the last {history_length} observations and your responses):\n"
    "[{history}]\n\nCurrent State:\nYou are at step {current_step}. Your current observation is: "
    "[{current_observation}]\n\nAnswer in the format <answer>[your action]</answer>, in at most "
    "{max_response_length} tokens. Decide the next action:"
)
# Fields each manager fills in its templates (any subset may be used).
TRAJ_TEMPLATE_FIELDS = {"observation", "turn_idx", "actions_left", "max_response_length", "suffix"}
STEP_TEMPLATE_FIELDS = {
    "env_instruction",
    "history",
    "history_length",
    "step_count",
    "current_step",
    "current_observation",
    "max_response_length",
    "suffix",
}
# ROLL's env manager class paths, accepted as they appear in ROLL YAML files.
ENV_MANAGER_ALIASES = {
    "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager": "traj",
    "roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager": "step",
    "roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager": "step_concat",
    "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager": "agent_native",
}
STEP_MANAGERS = frozenset({"step", "step_concat", "agent_native"})
"""Managers that lay samples out step-wise (one row per turn)."""


def is_step_manager(env_manager_cls: str) -> bool:
    """Whether ``env_manager_cls`` (roll's name or ROLL's class path) lays samples out step-wise."""
    return ENV_MANAGER_ALIASES.get(env_manager_cls, env_manager_cls) in STEP_MANAGERS


# ROLL's column names for reward_normalization.grouping -> ours (we name per-row columns in the singular, like RLVR).
GROUPING_ALIASES = {"tags": "tag", "env_ids": "env_id", "group_ids": "group_id"}
# The sample columns roll's own env managers write that reward_normalization.grouping may name (an episode's ids),
# and those only step-wise rows have (one row per turn).
GROUPING_COLUMNS = ("traj_group_id", "tag", "env_id", "group_id", "traj_id", "episode_id")
STEP_GROUPING_COLUMNS = ("step", "state_hash")
# ROLL's ProxyEnvManager drives an agent runner; its GEMRunner plays a gem env as a chat (env instruction in the system
# message, each observation a user message, the sum of step rewards as the score): roll's traj manager with
# env_instruction_in_system. ROLL's other runners (ToolCallRunner, the ROCK sandbox runners) have no roll counterpart.
ROLL_PROXY_ENV_MANAGER = "roll.pipeline.agentic.env_manager.proxy_env_manager.ProxyEnvManager"
ROLL_GEM_RUNNER = "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner"
# ROLL's other env managers: why roll has no counterpart.
_ROLL_MANAGERS = "roll.pipeline.agentic.env_manager."
ROLL_MANAGERS_WITHOUT_COUNTERPART = {
    _ROLL_MANAGERS + "vl_traj_env_manager.VLTrajEnvManager": "it plays image-observation envs for vision-language "
    "models; roll has no multimodal pipeline",
}
# ROLL env types that need a service roll does not have (none at present).
ROLL_ENVS_WITHOUT_COUNTERPART: dict[str, str] = {}
# Env types whose env_config is checked when the config loads (their settings models need no optional package).
ROCK_ENV = "rock_tb_native_env"
# Answers with chat message lists, which only the agent_native manager renders.
ATROPOS_ENV = "atropos_env"
# An OpenReward session may start a container: the SDK waits up to 600 s for a backend that is starting, and
# openreward_env retries a session that fails to open; a tool call (a shell command) may be slow too.
OPENREWARD_ENV, OPENREWARD_STEP_TIMEOUT_S = "openreward_env", 900.0
# Its first reset starts a sandbox and a game server in it (roll.agentic.env.sokoban_sandbox).
SOKOBAN_SANDBOX_ENV = "sokoban_sandbox"
ROLL_GROUP_FILTER = "roll.pipeline.agentic.agentic_pipeline.GroupFilter"
ROLL_ENV_WORKER = "roll.pipeline.agentic.environment_worker.EnvironmentWorker"


PARSE_TOOL_CALL_DESCRIPTION = (
    "agent_native envs: render assistant tool-call arguments given as JSON strings as dicts (for chat templates "
    "that expect dicts, e.g. Qwen3-Coder's); sets each custom_envs entry's parse_tool_call_arguments unless the "
    "entry sets it."
)


def _sokoban_sandbox_limit(env_config: Any) -> float:
    """How long a sokoban_sandbox reset may take: its first starts the sandbox and the game server (settings that do
    not validate get the defaults' limit; the env entry's own check reports them)."""
    from roll.agentic.env.sokoban_sandbox.env import SokobanSandboxConfig

    try:
        return SokobanSandboxConfig.model_validate(env_config or {}).start_limit_s()
    except (ConfigError, ValidationError, TypeError):  # ValidationError: inside CustomEnvConfig's own validation
        return SokobanSandboxConfig().start_limit_s()


def spread_parse_tool_call(data: dict[str, Any]) -> dict[str, Any]:
    """ROLL's pipeline-wide ``parse_tool_call_parameter_to_dict`` -> every ``custom_envs`` entry's
    ``parse_tool_call_arguments`` (an entry's own setting wins)."""
    if data.get("parse_tool_call_parameter_to_dict") and isinstance(data.get("custom_envs"), dict):
        for spec in data["custom_envs"].values():
            if isinstance(spec, dict):
                spec.setdefault("parse_tool_call_arguments", True)
    return data


def spread_system_envs(data: dict[str, Any]) -> dict[str, Any]:
    """The pipeline-wide ``system_envs`` -> each env manager's (its own win), as every role already gets them: the env
    workers run the envs and tools, which read such variables (an API key, ``SEARCH_URL``). ROLL sets them in the
    driver's environment, which a one-node Ray cluster's workers inherit."""
    shared = data.get("system_envs")
    if not isinstance(shared, dict) or not shared:
        return data
    for key in ("train_env_manager", "val_env_manager"):
        section = data.get(key)
        if isinstance(section, dict):
            own = section.get("system_envs")
            data[key] = {**section, "system_envs": {**shared, **(own if isinstance(own, dict) else {})}}
    return data


def template_fields(template: str) -> set[str]:
    """The ``{name}`` fields of a ``str.format`` template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


class ToolConfig(RollModel):
    tool_id: str = Field(
        description="A registered tool (python_code, search, mcp, or one added with register_tool) or a Tool class's "
        "import path 'my_pkg.tools:MyTool'."
    )
    tool_args: dict[str, Any] = Field(default_factory=dict)


class ToolWrapperConfig(RollModel):
    """ROLL's ``tool_wrapper``: tools added to an env (see roll.agentic.tools.ToolEnvWrapper)."""

    wrapper_args: dict[str, Any] = Field(
        default_factory=dict,
        description="tool_reward, tool_success_reward, max_tool_uses, and tool_format: 'hermes' (roll's default, "
        "<tool_call> JSON) or 'gem' (GEM's <python>/<search>/... tags, as ROLL's tool examples; ROLL files' default).",
    )
    tool_configs: list[ToolConfig] = Field(default_factory=list)

    @field_validator("wrapper_args")
    @classmethod
    def _known_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        from roll.agentic.tools.formats import TOOL_FORMATS
        from roll.agentic.tools.wrapper import WRAPPER_ARGS

        unknown = sorted(set(value) - set(WRAPPER_ARGS))
        if unknown:
            raise ValueError(f"unknown keys {unknown}; accepted: {list(WRAPPER_ARGS)}")
        tool_format = value.get("tool_format", "hermes")
        if not isinstance(tool_format, str) or tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format {tool_format!r}: use one of {sorted(TOOL_FORMATS)}")
        return value


class CustomEnvConfig(RollModel):
    """One env tag of ``custom_envs``."""

    env_type: str = Field(description="frozen_lake, sokoban, arithmetic, tool_math, a GEM id, or 'pkg.mod:MyEnv'.")
    env_config: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the env.")
    max_steps: int = Field(default=10, ge=1, description="Most turns (actions) per episode.")
    max_tokens_per_step: int = Field(default=128, ge=1, description="Most generated tokens per turn.")
    max_tokens_per_traj: int | None = Field(
        default=None, ge=1, description="Most generated tokens per episode, all turns together (None: no limit)."
    )
    env_manager_cls: str = Field(
        default="traj",
        description="'traj', 'step', 'step_concat', 'agent_native' (message-list envs), or an import path of a "
        "manager class.",
    )
    history_length: int = Field(default=5, ge=0, description="Step-wise: past turns shown in each prompt.")
    agent_system_template: str | None = Field(default=DEFAULT_SYSTEM_TEMPLATE)
    agent_template: str | None = Field(default=None, description="Per-turn user message (default per manager).")
    use_thread_lock: bool = Field(default=False, description="Never run two calls of this tag's envs at once.")
    max_env_step_concurrent: int = Field(default=0, ge=0, description="Most concurrent env calls per worker (0: any).")
    step_timeout_s: float = Field(default=60.0, gt=0, description="reset()/step() taking longer ends the episode.")
    tool_wrapper: ToolWrapperConfig | None = None
    env_instruction_in_system: bool = Field(
        default=False,
        description="Traj-wise: append the env instruction to the system message (after a blank line) instead of "
        "opening the first user message with it (ROLL's GEMRunner layout).",
    )
    show_env_instruction: bool = Field(
        default=True,
        description="False: traj/step prompts leave out the env's instruction (the traj manager opens with the first "
        "observation; agent_native envs write their own messages). A tiny model with no English reads the board "
        "better without it (docs/results/agentic.md, 15).",
    )
    enable_thinking: bool | None = Field(
        default=False,
        description="Chat templates that read enable_thinking (Qwen3-style): false (ROLL's default for agentic "
        "prompts) ends each generation prompt with an empty think block, true lets the model think, null leaves the "
        "template's own default. Templates that do not read it render the same either way. ROLL files' "
        "env_config.enable_thinking moves here.",
    )
    parse_tool_call_arguments: bool = Field(
        default=False,
        description="agent_native: JSON-string tool-call arguments of assistant messages are rendered as dicts "
        "(ROLL's parse_tool_call_parameter_to_dict; a message whose arguments do not parse gets its calls appended "
        "to its content).",
    )
    agent_runner_cls: str | None = Field(
        default=None, description=f"ROLL's {ROLL_GEM_RUNNER} only (the traj manager, env_instruction_in_system)."
    )

    @field_validator("env_type")
    @classmethod
    def _known_env(cls, value: str) -> str:
        reason = ROLL_ENVS_WITHOUT_COUNTERPART.get(value)
        if reason is not None:
            raise ValueError(f"env_type {value!r} is not supported: {reason}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _rock_timeout(cls, data: Any) -> Any:
        """A ROCK episode's reset starts a sandbox and installs an agent: unless set, a call may take as long as the
        episode's ``max_env_time`` (default 3000 s), not the 60 s of other envs; an OpenReward one's, 900 s; a
        sokoban_sandbox one's, its sandbox's and server's start timeouts and three commands (default 780 s)."""
        if isinstance(data, dict) and data.get("env_type") == ROCK_ENV and "step_timeout_s" not in data:
            env_config = data.get("env_config") or {}
            limit = env_config.get("max_env_time", 3000) if isinstance(env_config, dict) else 3000
            return {**data, "step_timeout_s": limit}
        if isinstance(data, dict) and data.get("env_type") == OPENREWARD_ENV and "step_timeout_s" not in data:
            return {**data, "step_timeout_s": OPENREWARD_STEP_TIMEOUT_S}
        if isinstance(data, dict) and data.get("env_type") == SOKOBAN_SANDBOX_ENV and "step_timeout_s" not in data:
            return {**data, "step_timeout_s": _sokoban_sandbox_limit(data.get("env_config"))}
        return data

    @model_validator(mode="after")
    def _check_rock(self) -> CustomEnvConfig:
        if self.env_type == ROCK_ENV:
            from roll.agentic.env.rock.env import check_env_config

            check_env_config(self.env_config)
        if self.env_type == SOKOBAN_SANDBOX_ENV:
            from roll.agentic.env.sokoban_sandbox.env import check_config

            check_config(self.env_config)
        return self

    @model_validator(mode="after")
    def _atropos_manager(self) -> CustomEnvConfig:
        if self.env_type == ATROPOS_ENV and self.env_manager_cls in ("traj", "step", "step_concat"):
            raise ValueError(
                f"env_type {self.env_type!r} answers with chat message lists, which the {self.env_manager_cls} manager "
                "cannot render: set env_manager_cls: agent_native (ROLL's AgentNativeStepEnvManager)"
            )
        return self

    @field_validator("env_manager_cls")
    @classmethod
    def _alias(cls, value: str) -> str:
        reason = ROLL_MANAGERS_WITHOUT_COUNTERPART.get(value)
        if reason is not None:
            raise ValueError(f"ROLL's {value.rsplit('.', 1)[-1]} is not supported: {reason}")
        return ENV_MANAGER_ALIASES.get(value, value)

    @field_validator("agent_runner_cls")
    @classmethod
    def _no_runner(cls, value: str | None) -> str | None:
        if value is not None and value != ROLL_GEM_RUNNER:
            raise ValueError(
                f"agent runner {value!r} is not supported: roll runs ROLL's GEMRunner (as its traj env manager) "
                "only; ToolCallRunner and the ROCK sandbox runners have no counterpart (remove agent_runner_cls)"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _gem_runner(cls, data: Any) -> Any:
        """ROLL's ProxyEnvManager + GEMRunner -> the traj manager with GEMRunner's message layout."""
        if not isinstance(data, dict):
            return data
        proxy = data.get("env_manager_cls") == ROLL_PROXY_ENV_MANAGER
        if data.get("agent_runner_cls") == ROLL_GEM_RUNNER and data.get("env_manager_cls", ROLL_PROXY_ENV_MANAGER) in (
            ROLL_PROXY_ENV_MANAGER,
            "traj",
        ):
            return {**data, "env_manager_cls": "traj", "env_instruction_in_system": True}
        if proxy:
            raise ValueError(
                f"{ROLL_PROXY_ENV_MANAGER} drives an agent runner: roll supports it with agent_runner_cls "
                f"{ROLL_GEM_RUNNER} only (got {data.get('agent_runner_cls')!r})"
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_template(cls, data: Any) -> Any:
        # The default per-turn template depends on the manager; it is filled into the raw data, so a validated
        # config is never changed afterwards.
        if not isinstance(data, dict) or data.get("agent_template") is not None:
            return data
        manager = data.get("env_manager_cls", "traj")
        step_wise = isinstance(manager, str) and is_step_manager(manager)
        return {**data, "agent_template": DEFAULT_STEP_AGENT_TEMPLATE if step_wise else DEFAULT_AGENT_TEMPLATE}

    @model_validator(mode="after")
    def _check_templates(self) -> CustomEnvConfig:
        step_wise = self.env_manager_cls in STEP_MANAGERS
        # agent_native renders the env's own messages: it has no templates to check.
        if self.env_manager_cls in ("traj", *STEP_MANAGERS) and self.env_manager_cls != "agent_native":
            allowed = STEP_TEMPLATE_FIELDS if step_wise else TRAJ_TEMPLATE_FIELDS
            unknown = sorted(template_fields(self.agent_template or "") - allowed)
            if unknown:
                raise ValueError(
                    f"agent_template uses fields {unknown} that the {self.env_manager_cls} manager does not fill; "
                    f"available: {sorted(allowed)}"
                )
        if not self.show_env_instruction:
            if self.env_instruction_in_system:
                raise ValueError("show_env_instruction is false but env_instruction_in_system is true; set one of them")
            if step_wise and "env_instruction" in template_fields(self.agent_template or ""):
                raise ValueError(
                    "show_env_instruction is false but agent_template names {env_instruction}; remove the field "
                    "from the template or show the instruction"
                )
        return self


OPENAI_PROXY_KEYS = {
    "base_url",
    "model_name",
    "api_key",
    "api_key_env",
    "timeout",
    "max_retries",
    "retry_delay",
    "token_ids",
    "api",
    "enable_thinking",
    "native_tools",
}


class LLMProxyConfig(RollModel):
    """Who acts in a manager's episodes (ROLL's ``llm_proxy``): ``policy``, the model served by actor_infer;
    ``openai``, an OpenAI-compatible endpoint (:class:`~roll.agentic.policy.OpenAIProxyClient`, ``proxy_config``:
    ``base_url``, ``model_name``, ``api_key`` or ``api_key_env``, ``timeout``, ``max_retries``, ``retry_delay``,
    ``token_ids`` (the answer's sampled ids as the response: default true with completions, false with chat, where
    vLLM answers them and a hosted API refuses the request), ``api`` (``completions``: the rendered prompt; ``chat``:
    the turn's messages, for chat-only hosted models), ``enable_thinking`` (chat), ``native_tools`` (chat: the env's
    tools offered as ``tools``, tool calls structured in the history; default true)); or
    ``random``, the env's own ``sample_random_action()``, drawn with each turn's sampling seed (a baseline to read
    scores against that repeats run to run, and an env smoke test that needs no model). Their episodes are not the
    trained policy's samples: a training manager refuses them."""

    proxy_type: Literal["policy", "openai", "random"] = Field(
        default="policy",
        description="policy: actor_infer generates each turn; openai: an OpenAI-compatible endpoint; random: the "
        "env's random actions.",
    )
    proxy_config: dict[str, Any] = Field(default_factory=dict, description="openai: the endpoint's settings.")

    @model_validator(mode="after")
    def _check(self) -> LLMProxyConfig:
        keys = set(self.proxy_config)
        if self.proxy_type != "openai" and keys:
            raise ValueError(
                f"proxy_config {sorted(keys)} is set but proxy_type {self.proxy_type} takes no settings; remove it"
            )
        if self.proxy_type == "openai":
            unknown, missing = sorted(keys - OPENAI_PROXY_KEYS), sorted({"base_url", "model_name"} - keys)
            if unknown or missing:
                raise ValueError(
                    f"proxy_type openai: proxy_config {'has unknown keys ' + str(unknown) if unknown else ''}"
                    f"{'; ' if unknown and missing else ''}{'lacks ' + str(missing) if missing else ''}; it takes "
                    f"{sorted(OPENAI_PROXY_KEYS)} (base_url and model_name required){_closest(unknown)}"
                )
            api = self.proxy_config.get("api", "completions")
            if api not in ("completions", "chat"):
                raise ValueError(
                    f"proxy_config.api {api!r} is not completions (the rendered prompt, "
                    "vLLM-like servers) or chat (the turn's messages, chat-only hosted models)"
                )
            # A key the chosen api never reads would be dropped without a word: the user meant the other api.
            unread = sorted(keys & _CHAT_ONLY_KEYS) if api == "completions" else []
            if unread:
                raise ValueError(
                    f"proxy_config {unread} only apply to api: chat, and this proxy's api is {api}"
                    f"{' (the default)' if 'api' not in keys else ''}: remove them, or set proxy_config.api: chat"
                )
        return self


_CHAT_ONLY_KEYS = {"enable_thinking", "native_tools"}


def _closest(unknown: list[str]) -> str:
    """'; did you mean ...' for misspelt proxy_config keys (empty when none is close to a known key)."""
    hints = [
        f"{key!r} -> {close[0]!r}"
        for key in unknown
        if (close := difflib.get_close_matches(key, sorted(OPENAI_PROXY_KEYS), n=1, cutoff=0.6))
    ]
    return f"; did you mean {', '.join(hints)}?" if hints else ""


class EnvManagerConfig(WorkerConfig):
    """The EnvironmentWorker role of one scheduler (train or val): env groups, tags and workers.

    ``world_size`` is derived: ``ceil(num_envs / max_env_num_per_worker)``, where ``num_envs`` is
    ``num_env_groups * (group_size + group_size_redundancy)``.
    """

    name: str = "train_env"
    worker_cls: Any = Field(default="roll.agentic.worker.EnvironmentWorker")
    num_env_groups: int = Field(default=1, ge=1, description="Groups of envs; a group's envs share one seed.")
    group_size: int = Field(default=1, ge=1, description="Envs (episodes) per group: GRPO's group.")
    group_size_redundancy: int = Field(
        default=0,
        ge=0,
        description="Extra envs per group (ROLL's): a round plays group_size + group_size_redundancy episodes on its "
        "seed and keeps the first group_size to finish without an env fault; the others are cancelled. Rounds stop "
        "waiting for their slowest episodes and absorb env faults; the kept episodes lean toward the quicker ones.",
    )
    tags: list[str] = Field(default_factory=list, description="custom_envs tags run by this manager.")
    num_groups_partition: list[int] | None = Field(
        default=None, description="Groups per tag (default: num_env_groups split evenly over tags)."
    )
    max_env_num_per_worker: int = Field(default=0, ge=0, description="Envs per EnvironmentWorker (0: all in one).")
    max_traj_per_env: int = Field(
        default=-1, description="Most episodes an env runs per batch request (-1: as many as needed)."
    )
    group_filter_cls: str = Field(
        default="roll.agentic.scheduler.filters.GroupFilter",
        description="Class with filter(group_id, episode_id, episodes) -> True to drop the group.",
    )
    max_launch_factor: int = Field(
        default=4,
        ge=1,
        description="Training: the most rounds one step launches, as a multiple of the groups it needs; dropped rounds "
        "(faults, group_filter_cls) are replaced up to it, and a step that reaches it trains on the groups it kept. A "
        "filter that drops most rounds (dynamic sampling on a policy that mostly succeeds) needs more.",
    )
    generating_args: GenerationConfig | None = Field(default=None, description="Sampling of this manager's turns.")
    llm_proxy: LLMProxyConfig = Field(
        default_factory=LLMProxyConfig, description="Who acts: the policy (default) or the env's random actions."
    )

    @field_validator("worker_cls", mode="before")
    @classmethod
    def _roll_worker(cls, value: Any) -> Any:
        return "roll.agentic.worker.EnvironmentWorker" if value == ROLL_ENV_WORKER else value

    @field_validator("group_filter_cls")
    @classmethod
    def _roll_filter(cls, value: str) -> str:
        return "roll.agentic.scheduler.filters.GroupFilter" if value == ROLL_GROUP_FILTER else value

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        # Derived values (the even split of groups over tags, envs per worker, world_size) are filled into the raw
        # data; _check below validates them. Values that are not numbers yet are left to the field validators.
        if not isinstance(data, dict):
            return data
        try:
            groups = int(data.get("num_env_groups", 1))
            total = groups * (int(data.get("group_size", 1)) + int(data.get("group_size_redundancy") or 0))
            per_worker = int(data.get("max_env_num_per_worker") or 0) or total
        except (TypeError, ValueError):
            return data
        out = {**data, "max_env_num_per_worker": per_worker}
        if per_worker > 0:
            out["world_size"] = -(-total // per_worker)
        tags = data.get("tags") or []
        if data.get("num_groups_partition") is None and isinstance(tags, list) and tags:
            base, extra = divmod(groups, len(tags))
            out["num_groups_partition"] = [base + (1 if i < extra else 0) for i in range(len(tags))]
        return out

    @model_validator(mode="after")
    def _check(self) -> EnvManagerConfig:
        if not self.tags:
            raise ValueError(f"{self.name}: tags is empty; list the custom_envs tags this manager runs")
        partition = self.num_groups_partition or []
        if len(partition) != len(self.tags) or sum(partition) != self.num_env_groups or min(partition) < 0:
            raise ValueError(
                f"{self.name}: num_groups_partition {partition} must give one count >= 0 per tag {self.tags} "
                f"summing to num_env_groups={self.num_env_groups}"
            )
        if self.generating_args is not None and self.generating_args.num_return_sequences != 1:
            raise ValueError(f"{self.name}.generating_args.num_return_sequences must be 1 (one response per turn)")
        return self

    def check_proxy_thinking(self, section: str, custom_envs: dict[str, CustomEnvConfig]) -> None:
        """Under ``llm_proxy`` openai with ``api: chat`` the server renders each turn's messages and roll renders the
        sample's prompt: a ``proxy_config.enable_thinking`` other than a tag's ``enable_thinking`` would pair a prompt
        that says one thing with an answer generated under the other. ValueError (a ConfigError at load) naming both."""
        proxy = self.llm_proxy
        thinking = proxy.proxy_config.get("enable_thinking")
        if proxy.proxy_type != "openai" or proxy.proxy_config.get("api") != "chat" or thinking is None:
            return
        differ = sorted(
            tag for tag in set(self.tags) & set(custom_envs) if custom_envs[tag].enable_thinking != thinking
        )
        if differ:
            values = ", ".join(f"{tag}: {custom_envs[tag].enable_thinking}" for tag in differ)
            raise ValueError(
                f"{section}.llm_proxy.proxy_config.enable_thinking is {thinking}, but custom_envs {values} "
                "(enable_thinking): the server would render each turn one way and the samples' prompts the other. Set "
                f"custom_envs.<tag>.enable_thinking: {str(thinking).lower()} for those tags, or remove "
                "proxy_config.enable_thinking to leave the server's template default"
            )

    def turn_generation(self, default: GenerationConfig) -> GenerationConfig:
        """How this manager's turns are sampled: its own ``generating_args``, else ``default`` (actor_infer's)."""
        return self.generating_args or default

    @property
    def envs_per_group(self) -> int:
        """The envs of one group: ``group_size`` kept episodes per round plus the redundant ones."""
        return self.group_size + self.group_size_redundancy

    @property
    def num_envs(self) -> int:
        return self.num_env_groups * self.envs_per_group

    def groups_for(self, batch_size: int | None, setting: str = "batch size", section: str | None = None) -> int:
        """The groups a batch of ``batch_size`` trajectories takes (None: every group once); ConfigError naming
        ``setting`` and this manager (``section``, default its name) when it is not a whole number of groups or more
        than ``max_traj_per_env`` rounds allow."""
        section = section or self.name
        if batch_size is None:
            return self.num_env_groups
        size = self.group_size
        if batch_size < size or batch_size % size:
            raise ConfigError(
                f"{setting}={batch_size} must be a positive multiple of {section}.group_size={size}: rollouts "
                "come in whole groups"
            )
        needed = batch_size // size
        cap = self.max_traj_per_env
        if cap > 0 and needed > cap * self.num_env_groups:
            raise ConfigError(
                f"{setting}={batch_size} needs {needed} groups but {section} has {self.num_env_groups} groups x "
                f"max_traj_per_env={cap}: raise max_traj_per_env or num_env_groups"
            )
        return needed


class RewardNormalizationConfig(RollModel):
    """ROLL's ``reward_normalization``: statistics per ``grouping`` column; ``method`` derives the mean/std types
    unless ``norm_mean_type``/``norm_std_type`` are set (see roll.pipelines.algorithms.grouped_reward_norm)."""

    grouping: str = Field(default="batch", description="'batch', or a column: traj_group_id, tag, ...")
    method: Literal["identity", "mean", "mean_std", "asym_clip"] = "identity"
    norm_mean_type: Literal["batch", "group"] | None = None
    norm_std_type: Literal["batch", "group"] | None = None

    @field_validator("grouping")
    @classmethod
    def _alias(cls, value: str) -> str:
        return GROUPING_ALIASES.get(value, value)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        # The mean/std types ROLL derives from method and grouping, filled into the raw data where not given.
        from roll.pipelines.algorithms import reward_norm_types

        if not isinstance(data, dict):
            return data
        method, grouping = data.get("method", "identity"), data.get("grouping", "batch")
        if method not in ("identity", "mean", "mean_std", "asym_clip") or not isinstance(grouping, str):
            return data  # the field validators name the bad value
        mean_type, std_type = reward_norm_types(method, GROUPING_ALIASES.get(grouping, grouping))
        out = dict(data)
        if out.get("norm_mean_type") is None:
            out["norm_mean_type"] = mean_type
        if out.get("norm_std_type") is None:
            out["norm_std_type"] = std_type
        return out
