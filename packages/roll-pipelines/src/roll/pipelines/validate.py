"""``roll validate``: everything about a config that is knowable without starting a worker.

Checked, per role: the backend's library is installed (its pip extra otherwise), the model and tokenizer load
(their configs and tokenizer files are read; hub ids from the local cache), the data files exist and have the columns
the task needs, fsdp2's ``ulysses_size`` divides the world size and the model's attention heads, and the device
mapping fits the cluster (the declared ``num_nodes`` x ``num_gpus_per_node``, and the Ray cluster itself unless
``--no-ray``). Pipeline-wide: each tracker of ``track_with`` has its package, each reward
domain's ``reward_type`` resolves, every prompt carries the fields its reward needs, and the pipeline's own
``deployment_checks`` pass (agentic: each env entry, each ROCK env's task file and service, ``sequence_length``
against each env tag's first prompt and the model's positions), and ``output_dir`` and ``checkpoint_dir`` can be
made and written. Every problem is reported, not just the first.

With ``--no-ray`` (checking a config away from the machine it runs on), what depends on this machine (a package that
is not installed, a local model or data file that is not here, a hub id missing from the offline cache, a service
that does not answer) is a warning line, not an error; the config's own problems stay errors.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from roll.pipelines.config import FOLDER_FIX, BaseConfig, RoleConfig, folder_problem
from roll.pipelines.hub import HubError, cached_hub_repo, hub_offline, is_hub_id, use_modelscope
from roll.runtime import ConfigError, MissingExtraError, RollError

__all__ = [
    "NotHereError",
    "ServiceUnreachableError",
    "ping_service",
    "readable_model_folder",
    "validate_deployment",
    "worker_count_warning",
]


class NotHereError(ConfigError):
    """A model reference names a local folder that does not exist (on this machine)."""


class ServiceUnreachableError(ConfigError):
    """A service the run needs (e.g. a ROCK sandbox service) does not answer from this machine."""


def ping_service(url: str, what: str, fix: str, *, timeout_s: float = 3.0, method: str = "GET") -> None:
    """Raise :class:`ServiceUnreachableError` ("``what`` does not answer (why); ``fix``") unless ``url`` answers;
    any HTTP answer counts, an error status included (an endpoint may take POST only)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        pass  # it answered
    except (OSError, ValueError) as e:  # URLError is an OSError; ValueError: not a URL
        raise ServiceUnreachableError(f"{what} does not answer ({getattr(e, 'reason', e)}); {fix}") from None


def _about_this_machine(error: RollError) -> bool:
    from roll.pipelines.data.sources import DataNotFoundError

    return isinstance(error, MissingExtraError | HubError | NotHereError | DataNotFoundError | ServiceUnreachableError)


class _Problems:
    """Roll errors collected from independent checks; raised together at the end. Away from the run's machine
    (``here=False``), problems of this machine only are warning lines."""

    def __init__(self, *, here: bool, away: str = "not checked further: --no-ray") -> None:
        self.here = here
        self.away = away
        self.errors: list[RollError] = []

    def run(self, check: Callable[[], str | None], lines: list[str]) -> None:
        try:
            line = check()
        except RollError as e:
            if self.here or not _about_this_machine(e):
                self.errors.append(e)
            else:
                lines.append(f"warning: {e} ({self.away})")
        else:
            if line:
                lines.append(line)

    def raise_if_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            listed = "\n".join(f"  - {e}" for e in self.errors)
            raise ConfigError(f"{len(self.errors)} problems found:\n{listed}")


# --- models -----------------------------------------------------------------------------------------------------
def _local_model_folder(where: str, value: str, revision: str | None) -> Path | None:
    """The local folder a model reference reads, or None when it is only made at run time (recipe://, hub ids to be
    downloaded, smollm2://, ModelScope ids)."""
    if value.startswith("tiny://"):
        from roll.strategies.testing import TINY_PRESETS

        preset = urlparse(value).netloc or "nano"
        if preset not in TINY_PRESETS:
            raise ConfigError(f"{where}={value!r}: unknown tiny preset; use one of {sorted(TINY_PRESETS)}")
        return None
    if value.startswith("recipe://"):
        from roll.pipelines.recipes import recipe_path

        recipe_path(urlparse(value).netloc)
        return None
    if "://" in value:
        from roll.pipelines.assets import MODEL_SCHEMES

        if value.partition("://")[0] not in MODEL_SCHEMES:
            raise ConfigError(f"{where}={value!r}: unknown scheme; use one of {sorted(MODEL_SCHEMES)} or recipe")
        return None
    path = Path(value).expanduser()
    if path.exists():
        return path
    if not is_hub_id(value):
        raise NotHereError(f"{where}={value!r} does not exist and is not a hub id; give a local HF folder or a hub id")
    if use_modelscope():
        return None
    try:
        cached = cached_hub_repo(value, revision=revision)
    except HubError as e:
        raise HubError(f"{where}={value!r} is no local folder, and as a hub id: {e}") from e
    return cached


def readable_model_folder(where: str, value: str, revision: str | None = None) -> Path | None:
    """The local folder model reference ``value`` reads on this machine now: a local folder, a hub id in the local
    cache, or a ``tiny://`` preset (built into the asset cache, as ``roll run`` builds it); None where the model is only
    made at run time (``recipe://``, ``smollm2://``, ModelScope ids). A reference that is not here raises as the model
    checks do (NotHereError, HubError, ConfigError), naming ``where``."""
    folder = _local_model_folder(where, value, revision)
    if folder is None and value.startswith("tiny://"):
        from roll.pipelines.assets import resolve_model_uri

        return Path(str(resolve_model_uri(value)))
    return folder


def _check_model(where: str, path: Path, trust_remote_code: bool) -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError... for unusable folders
        raise ConfigError(f"{where}: {path} holds no loadable model config ({type(e).__name__}: {e})") from None


def _check_tokenizer(where: str, path: Path, trust_remote_code: bool) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as e:  # as above: no common base class
        raise ConfigError(f"{where}: {path} holds no loadable tokenizer ({type(e).__name__}: {e})") from None
    if len(tokenizer) <= 1:  # transformers builds an empty tokenizer from a model config alone
        raise ConfigError(
            f"{where}: {path} holds no loadable tokenizer (no vocabulary: its tokenizer files are missing); set "
            f"tokenizer_name_or_path to a folder that has them"
        )


def _model_checks(name: str, role: RoleConfig, seen: set[str]) -> list[Callable[[], str | None]]:
    """Checks of ``role``'s model and tokenizer; a reference already checked for another role is skipped (the
    tokenizer is loaded from the model's folder unless ``tokenizer_name_or_path`` names another one)."""
    args = role.model_args
    loads: dict[str, list[Any]] = {}
    if args.model_name_or_path:
        loads.setdefault(args.model_name_or_path, [f"{name}.model_args.model_name_or_path"]).append(_check_model)
    if args.tokenizer_path:
        field = "tokenizer_name_or_path" if args.tokenizer_name_or_path else "model_name_or_path"
        loads.setdefault(args.tokenizer_path, [f"{name}.model_args.{field}"]).append(_check_tokenizer)
    checks: list[Callable[[], str | None]] = []
    for value, (where, *steps) in loads.items():
        if value in seen:
            continue
        seen.add(value)

        def check(where: str = where, value: str = value, steps: list[Any] = steps) -> str | None:
            folder = _local_model_folder(where, value, args.revision)
            if folder is None:
                return f"{where}: {value} is downloaded at run time" if is_hub_id(value) else None
            for load in steps:
                load(where, folder, args.trust_remote_code)
            return None

        checks.append(check)
    return checks


def _model_config(where: str, role: RoleConfig) -> Any | None:
    """The role's HF model config when it can be read here (a tiny preset, a local folder or the hub cache)."""
    value = role.model_args.model_name_or_path
    if not value:
        return None
    if value.startswith("tiny://"):
        from types import SimpleNamespace

        from roll.strategies.testing import TINY_PRESETS

        preset = TINY_PRESETS.get(urlparse(value).netloc or "nano")
        if preset is None:
            return None  # the model check names the unknown preset
        return SimpleNamespace(num_attention_heads=preset["num_heads"], num_key_value_heads=preset["num_kv_heads"])
    folder = _local_model_folder(where, value, role.model_args.revision)
    if folder is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=role.model_args.trust_remote_code)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _world_fix(name: str, role: RoleConfig) -> str:
    return f"change {name}.device_mapping" if role.device_mapping is not None else f"set {name}.world_size"


def _check_fsdp_size(name: str, role: RoleConfig) -> None:
    """fsdp2's ``fsdp_size`` (the shard group) divides the role's world size, as the worker's mesh needs."""
    strategy = role.strategy_args
    if strategy is None or not strategy.strategy_name.startswith("fsdp2"):
        return
    size = (strategy.strategy_config or {}).get("fsdp_size")
    world = role.world_size or 1
    if isinstance(size, int) and size > 0 and world % size:
        where = f"{name}.strategy_args.strategy_config.fsdp_size"
        raise ConfigError(
            f"{where}={size} must divide {name}'s world size {world} (parameters are sharded over fsdp_size workers "
            f"and replicated across the groups); set {where} to a divisor of {world} or null (shard over every "
            f"worker), or {_world_fix(name, role)}"
        )


def _check_ulysses(name: str, role: RoleConfig) -> str | None:
    """fsdp2's ``ulysses_size`` divides the role's world size and splits the model's attention heads evenly."""
    strategy = role.strategy_args
    if strategy is None or not strategy.strategy_name.startswith("fsdp2"):
        return None
    size = int((strategy.strategy_config or {}).get("ulysses_size") or 1)
    if size == 1:
        return None
    where, world = f"{name}.strategy_args.strategy_config.ulysses_size", role.world_size or 1
    if world % size:
        raise ConfigError(
            f"{where}={size} must divide {name}'s world size {world} (its data-parallel size is world / "
            f"ulysses_size); set {where} to a divisor of {world}, or {_world_fix(name, role)}"
        )
    try:
        config = _model_config(f"{name}.model_args.model_name_or_path", role)
    except Exception:  # an unusable model reference: the model check reports it
        config = None
    if config is None:
        return f"{where}={size}: attention heads not checked (the model is read at run time)"
    from roll.strategies.contract import StrategyError
    from roll.strategies.ulysses import check_heads

    try:
        check_heads(config, size)
    except StrategyError as e:
        raise ConfigError(f"{where}: {e}") from None
    return None


# --- data and rewards -------------------------------------------------------------------------------------------
def _data_refs(role_name: str, role: RoleConfig) -> list[Callable[[], str | None]]:
    from roll.pipelines.data import check_data_reference

    data = role.data_args
    if data is None:
        return []
    checks: list[Callable[[], str | None]] = []
    for split in ("train", "eval"):
        for item in data.files(split):
            checks.append(functools.partial(check_data_reference, item, f"{role_name}.{data.field_for(split)}"))
    return checks


def _prompt_role(config: BaseConfig) -> tuple[str, RoleConfig] | None:
    roles = config.roles()
    for name in ("actor_train", "actor_infer"):
        if name in roles and roles[name].data_args is not None:
            return name, roles[name]
    return None


def _check_rewards(config: BaseConfig) -> str | None:
    """Each reward domain's type resolves, and every prompt has the fields its domain's reward needs."""
    from roll.pipelines.data import load_task_rows
    from roll.pipelines.rewards import resolve_reward_worker
    from roll.pipelines.rlvr.rollout import check_reward_fields, route_domain_column

    rewards: dict[str, Any] = getattr(config, "rewards", None) or {}
    found = _prompt_role(config)
    if not rewards or found is None:
        return None
    workers = {domain: resolve_reward_worker(reward.reward_type) for domain, reward in rewards.items()}
    role_name, role = found
    data = role.require_data()
    splits = {
        split: [_prompt_fields(row, data) for row in load_task_rows(data, "prompt", split=split)]
        for split in ("train", "eval")
        if data.files(split)
    }
    rewards = route_domain_column(list(splits.values()), rewards)
    counted = []
    for split, examples in splits.items():
        check_reward_fields(examples, rewards, workers, data_field=f"{role_name}.data_args")
        counted.append(f"{len(examples)} {split}")
    types = ", ".join(f"{domain}={reward.reward_type}" for domain, reward in rewards.items())
    return f"rewards: {types}; prompts checked for their fields ({', '.join(counted)})"


def _prompt_fields(row: dict[str, Any], data: Any) -> dict[str, Any]:
    """The fields an encoded prompt carries (roll.pipelines.data.encoding.encode_prompt), without tokenizing."""
    from roll.pipelines.data.encoding import carried_fields

    out = {"prompt": row.get(data.prompt_key), **carried_fields(row, data)}
    if data.messages_key is not None:
        out["messages"] = row.get(data.messages_key)
    return out


# --- devices ------------------------------------------------------------------------------------------------------
def _check_declared_devices(config: BaseConfig, name: str, role: RoleConfig) -> str | None:
    """``device_mapping`` against the cluster the config declares (num_nodes x num_gpus_per_node), if it does."""
    from roll.runtime import cpu_workers_fix, plan_devices
    from roll.strategies.registry import multi_node_strategies, runs_across_nodes

    mapping = role.device_mapping
    if mapping is None or config.num_gpus_per_node is None:
        return None
    per_node = config.num_gpus_per_node
    total = (config.num_nodes or 1) * per_node
    beyond = sorted(d for d in mapping if d >= total)
    if beyond and total == 0:
        raise ConfigError(
            f"{name}.device_mapping is set, but num_gpus_per_node=0 declares no GPUs: {cpu_workers_fix(name)}"
        )
    if beyond:
        raise ConfigError(
            f"{name}.device_mapping uses device ids {beyond}, but num_nodes={config.num_nodes or 1} x "
            f"num_gpus_per_node={per_node} gives ids 0..{total - 1}; use ids below {total} or declare more devices"
        )
    spans = runs_across_nodes(role)
    try:
        plans = plan_devices(role, num_gpus_per_node=per_node, spans_nodes=spans)
    except ConfigError as e:
        strategy = role.strategy_args.strategy_name if role.strategy_args is not None else None
        raise ConfigError(
            f"{e} (strategy {strategy!r} runs a worker's devices on one node; backends whose engine spans nodes: "
            f"{', '.join(multi_node_strategies())})"
        ) from None
    spanning = [rank for rank, shares in enumerate(plans) if len(shares) > 1]
    if not spanning:
        return None
    _check_node_layout(name, role, [[len(share.global_devices) for share in plans[rank]] for rank in spanning])
    nodes = {len(plans[rank]) for rank in spanning}
    return (
        f"{name}: {len(spanning)} of {len(plans)} worker(s) run one engine over {'/'.join(map(str, sorted(nodes)))} "
        f"nodes (the worker on its first node, engine processes on the others)"
    )


def _check_node_layout(name: str, role: RoleConfig, splits: list[list[int]]) -> None:
    """The backend's own rule for how an engine's devices may split over nodes (``node_layout_problem``)."""
    from roll.strategies import validate_strategy_config

    if role.strategy_args is None:
        return
    settings = validate_strategy_config(role.strategy_args.strategy_name, role.strategy_args.strategy_config)
    rule = getattr(settings, "node_layout_problem", None)
    if rule is None:
        return
    for sizes in splits:
        problem = rule(sizes)
        if problem:
            raise ConfigError(f"{name}: {problem}")


def _check_folders(config: BaseConfig) -> str | None:
    """``output_dir`` and ``checkpoint_dir`` can be made and written here (a ROLL file's
    ``checkpoint_config.output_dir`` often names a cluster's shared disk): a fact of this machine, so a warning
    under ``--no-ray``."""
    for field, path in (("output_dir", config.resolved_output_dir), ("checkpoint_dir", config.resolved_checkpoint_dir)):
        problem = folder_problem(path)
        if problem is not None:
            raise NotHereError(f"{field} {path}: {problem}; {FOLDER_FIX[field]}")
    return None


def _check_ray(config: BaseConfig) -> str:
    from roll.runtime import ResourceManager, init

    info = init()
    manager = ResourceManager(num_nodes=config.num_nodes, num_gpus_per_node=config.num_gpus_per_node)
    from roll.strategies.registry import runs_across_nodes

    for role in config.roles().values():
        manager.validate(role, spans_nodes=runs_across_nodes(role))
    return f"Ray: {len(manager.nodes)} node(s), {manager.total_devices} device(s), {info.num_cpus:g} CPUs"


# --- all together -------------------------------------------------------------------------------------------------
def _backend_check(name: str, role: RoleConfig) -> Callable[[], str | None]:
    from roll.strategies import check_attention_installed, check_backend_installed
    from roll.strategies.registry import HF_LOADING_STRATEGIES

    def check() -> str | None:
        if role.strategy_args is not None:
            check_backend_installed(
                role.strategy_args.strategy_name,
                lora=role.model_args.lora_rank > 0,
                where=f"{name}.strategy_args.strategy_name",
            )
            if role.strategy_args.strategy_name in HF_LOADING_STRATEGIES:
                where = f"{name}.model_args.attn_implementation"
                try:
                    check_attention_installed(role.model_args.attn_implementation, where)
                except ConfigError as e:  # a package this machine lacks: a warning away from the run's machine
                    raise NotHereError(str(e)) from None
        return None

    return check


def _tracker_check(tracker: str) -> Callable[[], str | None]:
    from roll.pipelines.tracking import check_tracker_installed

    def check() -> str | None:
        check_tracker_installed(tracker)
        return None

    return check


PROCESSES_PER_CORE = 4
"""More CPU-placed worker processes than this per core of a one-node run's machine get a warning."""


def worker_count_warning(config: BaseConfig) -> str | None:
    """A warning when a one-node run's CPU-placed workers (roles without ``device_mapping``: reward domains, teachers,
    CPU training) far outnumber this machine's cores: Ray reserves almost no CPU per worker, so nothing stops them
    from starting, but each is a process of its own (a ROLL GPU file asks for 16 reward workers per domain), and
    starting them takes minutes on a laptop. None on several nodes or a running cluster (``RAY_ADDRESS``)."""
    if (config.num_nodes or 1) > 1 or os.environ.get("RAY_ADDRESS"):
        return None
    cores = os.cpu_count() or 1
    counts = {name: role.world_size or 1 for name, role in config.roles().items() if role.device_mapping is None}
    total = sum(counts.values())
    if total <= PROCESSES_PER_CORE * cores:
        return None
    largest = sorted(counts.items(), key=lambda item: -item[1])[:3]
    listed = ", ".join(f"{name} {count}" for name, count in largest) + (", ..." if len(counts) > len(largest) else "")
    return (
        f"warning: {total} worker processes on this machine's {cores} CPU cores ({listed}): each is a process "
        f"of its own, so start-up and steps slow down; lower the largest, e.g. {largest[0][0]}.world_size=1"
    )


def package_warnings(config: BaseConfig) -> list[str]:
    """Warnings for each role's backend or attention package this machine lacks, for ``roll run`` before it starts
    Ray: the driver may lack what the workers' nodes have (a CPU head node without flash-attn), so these are not
    errors; a run whose workers lack them too fails at their model load after the clusters have started."""
    problems = _Problems(here=False, away="checked on this machine, not on the workers' nodes")
    lines: list[str] = []
    for name, role in config.roles().items():
        problems.run(_backend_check(name, role), lines)
    problems.raise_if_any()
    crowded = worker_count_warning(config)
    return [*lines, crowded] if crowded else lines


def validate_deployment(config: BaseConfig, *, check_ray: bool = True) -> list[str]:
    """A summary line per role (and per finding); raise the problems found, all of them, as one error.

    Raises:
        MissingExtraError: the only problem is an optional package that is not installed (with its pip command).
        ConfigError: any other problem, or several problems (each listed on its own line).
    """
    problems = _Problems(here=check_ray)
    lines: list[str] = []
    for tracker in config.track_with:
        problems.run(_tracker_check(tracker), lines)
    seen: set[str] = set()
    for name, role in config.roles().items():
        problems.run(_backend_check(name, role), lines)
        for check in [*_model_checks(name, role, seen), *_data_refs(name, role)]:
            problems.run(check, lines)
        problems.run(functools.partial(_check_declared_devices, config, name, role), lines)
        problems.run(functools.partial(_check_fsdp_size, name, role), lines)
        problems.run(functools.partial(_check_ulysses, name, role), lines)
        backend = role.strategy_args.strategy_name if role.strategy_args else "-"
        placement = f"devices {role.device_mapping}" if role.device_mapping is not None else "CPU"
        lines.append(f"{name}: {role.world_size} worker(s), {backend}, {placement}")
    problems.run(lambda: worker_count_warning(config), lines)
    problems.run(lambda: _check_rewards(config), lines)
    problems.run(lambda: _check_folders(config), lines)
    for check in config.deployment_checks():
        problems.run(check, lines)
    if check_ray and not problems.errors:
        problems.run(lambda: _check_ray(config), lines)
    problems.raise_if_any()
    if hub_offline():
        lines.append("hub ids: HF_HUB_OFFLINE is set; only the local cache is read")
    return lines
