"""``rollout.sequence_length`` checked at load time: against each env tag's first prompt and the model's positions.

Both would otherwise surface late: a first prompt that does not fit at the first turn, after every worker has started
(:mod:`roll.agentic.env_manager.base`); a length beyond the model's positions as a rollout engine that refuses to start,
or a model reading positions it never learned. ``roll validate`` and the agentic pipelines' setup (before any worker
starts) run these checks:

* Each env tag of the env managers is built once in the driver (:class:`~roll.agentic.driver_envs.DriverEnvs`, shared
  with the ``llm_proxy`` random-action check) and reset with the seed its first episode plays; its
  own env manager builds the first prompt (system and agent templates, the env's instruction, the chat template, a
  tool wrapper's tool prompt) and the tokenizer counts it. That prompt plus one turn's tokens (``max_tokens_per_step``,
  capped by ``actor_infer.generating_args.max_new_tokens``) must fit in ``rollout.sequence_length``. An env whose
  episodes are dataset rows (roll's dataset envs: training draws any row) is checked on the rows whose questions are
  longest in tokens instead (:func:`roll.agentic.env.dataset.longest_rows`): the first prompts of the
  :data:`RENDERED_ROWS` longest are rendered so, and the error names the file, the row and how many rows are too long.
  A tag whose env is not built in the driver is skipped with a note (a ROCK sandbox, rock_tb_native_env's or
  sokoban_sandbox's; a GEM env or one of roll's dataset envs that loads a hub dataset; an env whose build or reset
  fails, or takes over :data:`BUILD_TIMEOUT_S`, here): its first turn still checks it. An env that refuses its
  settings (a ``ConfigError`` from its constructor, or from its reset, e.g. ``frozen_lake`` whose ``split`` holds no
  layout) fails the check, naming the tag: every episode of the tag would, after every worker has started.
* ``rollout.sequence_length`` may not exceed the model's ``max_position_embeddings``, as vLLM refuses a longer
  ``max_model_len``, nor an inference engine's own cap (vLLM's ``max_model_len``, SGLang's ``context_length`` in
  ``strategy_config``), which would refuse an episode's later turns. A model whose config scales RoPE
  (``rope_parameters`` / ``rope_scaling`` with a ``factor``, e.g. YaRN) is allowed up to the scaled length, with a
  warning: whether quality holds there depends on the model.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll.agentic.config import ROCK_ENV, SOKOBAN_SANDBOX_ENV, CustomEnvConfig, EnvManagerConfig
from roll.agentic.driver_envs import BUILD_TIMEOUT_S, DriverEnvs, NotBuiltHere, in_thread
from roll.agentic.env.base import EnvLike, close_env
from roll.agentic.env.dataset import LongestRows
from roll.agentic.env.registry import ENVS, resolve_env_factory
from roll.agentic.env_manager import EnvFault, EpisodeTask
from roll.agentic.policy.protocol import GenerateRequest, GenerateResult
from roll.agentic.pool import EnvPool, EnvSlot, env_checks
from roll.agentic.scheduler.plan import GroupPlan, episode_seed, plan_groups
from roll.agentic.scheduler.scheduler import index_seeded_tags
from roll.pipelines.config import RoleConfig
from roll.pipelines.validate import NotHereError, ServiceUnreachableError, readable_model_folder
from roll.runtime import ConfigError, RollError
from roll.strategies import GenerationConfig

__all__ = [
    "BUILD_TIMEOUT_S",
    "RENDERED_ROWS",
    "length_checks",
    "max_positions",
    "run_length_checks",
    "setup_checks",
]

logger = logging.getLogger(__name__)

RENDERED_ROWS = 4
"""How many of a dataset env's longest questions (in tokens) get their first prompt rendered: the longest question
need not make the longest prompt, by the token or two where it meets the template."""
ROLL_KEY = "rollout.sequence_length (ROLL's sequence_length)"


class _NoPolicy:
    """The policy client of a manager that only builds a first prompt: it is never asked to generate."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        raise RuntimeError("the load-time prompt check sends no generation request")


# --- the first prompt --------------------------------------------------------------------------------------------
def _prompt_lengths(
    tag: str,
    spec: CustomEnvConfig,
    tokenizer: Any,
    env: EnvLike,
    *,
    seeds: Sequence[int],
    generation_config: GenerationConfig,
) -> list[int]:
    """The lengths of the first turn's model input of episodes of ``tag`` played with each of ``seeds`` on ``env``
    (the tag's env, built by the driver; closed here), built by the tag's own env manager from the env's reset
    (raises ``NotBuiltHere`` where the env cannot be reset)."""
    pool = EnvPool({tag: spec}, tokenizer, _NoPolicy(), generation_config=generation_config, sequence_length=1)
    try:
        manager = pool.make_manager(EnvSlot(0, 0, tag), env)
    except Exception as e:  # whatever the manager raises when set up; the run would meet it at its workers' start
        close_env(env)
        raise NotBuiltHere(f"setting up its env manager failed: {type(e).__name__}: {e}") from e

    async def render() -> list[int]:
        lengths = []
        for seed in seeds:
            task = EpisodeTask(0, 0, tag, 0, seed, f"{tag}-check", f"{tag}-check-0")
            try:
                state = await manager.start(task)
            except EnvFault as fault:
                cause = fault.__cause__
                if isinstance(cause, ConfigError) and not isinstance(cause, NotHereError | ServiceUnreachableError):
                    # the env refuses its settings at reset (frozen_lake's split with no layout in it): every episode
                    # of the tag would, after every worker has started; one about this machine is only a note
                    raise ConfigError(
                        f"env tag {tag!r}: its reset (seed {seed}) refuses the settings: {cause}"
                    ) from None
                raise NotBuiltHere(f"its reset failed ({fault.reason}: {fault})") from fault
            lengths.append(len(manager.build_prompt(state)[1]))
        return lengths

    try:
        return asyncio.run(render())
    finally:
        manager.close()


def _longest_rows(spec: CustomEnvConfig, longest: Callable[..., LongestRows], tokenizer: Any) -> LongestRows:
    """The rows of the tag's dataset with the longest questions."""
    try:
        return longest(tokenizer, **spec.env_config)
    except Exception as e:  # as building the env: the env entry's own check reports an unreadable dataset
        raise NotBuiltHere(f"reading its dataset failed: {type(e).__name__}: {e}") from e


def _skip_reason(spec: CustomEnvConfig) -> str | None:
    """Why the env of ``spec`` is not built in the driver at all, or None."""
    if spec.env_type == ROCK_ENV:
        return "its ROCK sandbox starts at run time"
    if spec.env_type == SOKOBAN_SANDBOX_ENV:
        from roll.agentic.env.sokoban_sandbox.env import ROCK_SANDBOX

        if spec.env_config.get("sandbox_cls", ROCK_SANDBOX) == ROCK_SANDBOX:
            return "its ROCK sandbox starts at run time"
    try:
        factory = resolve_env_factory(spec.env_type)
        if spec.env_type not in ENVS:  # only GEM ids resolve to GEM's factory
            from roll.agentic.env.gem import gem_dataset

            dataset = gem_dataset(factory, spec.env_config)
            if dataset is not None:
                return f"the GEM env loads the hub dataset {dataset!r} when built"
        elif getattr(factory, "seed_is_index", False):  # roll's dataset envs: a hub id is downloaded when built
            name = spec.env_config.get("dataset_name")
            if isinstance(name, str) and name and not Path(name).expanduser().exists():
                return f"its env loads the hub dataset {name!r} when built"
    except RollError as e:  # an unknown type or a missing extra: the env entry's own check reports it
        return str(e)
    return None


@dataclass(frozen=True)
class _Scheduler:
    """What the first prompt of a tag depends on in the scheduler that plays it."""

    key: str
    """The env manager's YAML key (``train_env_manager``, ``val_env_manager``)."""
    manager: EnvManagerConfig
    seed: int
    """The scheduler's base seed."""
    mode: str
    generation: GenerationConfig
    """How its turns are sampled."""
    generation_key: str

    def turn(self, spec: CustomEnvConfig) -> tuple[int, str]:
        """One turn's new tokens for ``spec`` and the setting that caps them."""
        turn = min(spec.max_tokens_per_step, self.generation.max_new_tokens)
        if turn == spec.max_tokens_per_step:
            return turn, f"max_tokens_per_step={spec.max_tokens_per_step}"
        return turn, f"{self.generation_key}.max_new_tokens={turn}"


def _first_seed(scheduler: _Scheduler, custom_envs: dict[str, CustomEnvConfig], plan: GroupPlan) -> int:
    """The seed of the tag's first episode, as the scheduler picks it: its first group's first round (validation of
    an env that picks items by seed asks item 0 first)."""
    if scheduler.mode == "val" and plan.tag in index_seeded_tags(scheduler.manager, custom_envs):
        return 0
    return episode_seed(scheduler.seed, plan.group_id, 0)


def _check_first_prompt(
    tag: str,
    spec: CustomEnvConfig,
    scheduler: _Scheduler,
    seed: Callable[[], int],
    tokenizer: Callable[[], Any],
    sequence_length: int,
    envs: DriverEnvs,
) -> str:
    reason = _skip_reason(spec)
    generation_config, where = scheduler.generation, scheduler.key
    turn, limit = scheduler.turn(spec)
    if reason is None:
        try:
            loaded = tokenizer()
            longest = getattr(resolve_env_factory(spec.env_type), "longest_questions", None)
            if callable(longest):
                read = functools.partial(_longest_rows, spec, longest, loaded)
                rows = in_thread(read, envs.timeout_s, "reading its dataset")
                picked = rows.tokens[:RENDERED_ROWS]  # the seed that plays a row is its index
                seeds = [row for row, _ in picked]
            else:
                first = seed()
                seeds = [first]
            env = envs.take(tag, spec)  # built once for every check that needs it, within envs.timeout_s
            build = functools.partial(
                _prompt_lengths, tag, spec, loaded, env, seeds=seeds, generation_config=generation_config
            )
            lengths = in_thread(build, envs.timeout_s, "resetting its env")
            if callable(longest):
                prompts = [(row, question, prompt) for (row, question), prompt in zip(picked, lengths, strict=True)]
                return _check_longest_rows(tag, where, rows, prompts, (turn, limit), sequence_length)
            prompt = lengths[0]
        except NotBuiltHere as e:
            reason = str(e)
    if reason is not None:
        return f"{tag}: first prompt not checked here ({reason}); its first turn checks it"
    if prompt + turn > sequence_length:
        raise ConfigError(
            f"env tag {tag!r} ({where}): its first prompt (seed {first}) is {prompt} tokens, and with one turn's "
            f"{turn} new tokens ({limit}) it needs {prompt + turn}, over {ROLL_KEY}={sequence_length}: raise "
            f"rollout.sequence_length to at least {prompt + turn}, or shorten the tag's agent_system_template, "
            f"agent_template or env instruction"
        )
    return f"{tag}: first prompt {prompt} tokens + {turn} per turn ({limit}) fit in sequence_length {sequence_length}"


def _check_longest_rows(
    tag: str,
    where: str,
    rows: LongestRows,
    prompts: Sequence[tuple[int, int, int]],
    turn_limit: tuple[int, str],
    sequence_length: int,
) -> str:
    """The first prompts of a dataset env's longest questions (``(row, question tokens, prompt tokens)``) against
    ``sequence_length``."""
    (turn, limit), n = turn_limit, rows.rows
    row, question, prompt = max(prompts, key=lambda item: (item[2], -item[0]))
    counted = f"of its {n} rows" if rows.every_row else f"of the {len(rows.tokens)} longest by characters of its {n}"
    top = rows.tokens[0][1]
    size = f"the longest {counted}" if question == top else f"the longest {counted} is {top}"
    if prompt + turn > sequence_length:
        template = prompt - question
        fits = sequence_length - turn - template  # the template's tokens stay; the question's must fit beside them
        if fits > 0:
            count = rows.rows_over(fits)
            over = f"{'' if rows.every_row else 'at least '}{count} of its {n} rows"
            has = "has a question" if count == 1 else "have questions"
            fix = f"or filter the dataset ({over} {has} over the {fits} tokens that fit)"
        else:
            fix = (
                f"or shorten the tag's agent_system_template, agent_template or env instruction (the prompt without "
                f"the question is {template} tokens)"
            )
        raise ConfigError(
            f"env tag {tag!r} ({where}): row {row} of {rows.dataset} (its question is {question} tokens, {size}) "
            f"makes a first prompt of {prompt} tokens, and with one turn's {turn} new tokens "
            f"({limit}) it needs {prompt + turn}, over {ROLL_KEY}={sequence_length}: raise rollout.sequence_length to "
            f"at least {prompt + turn}, {fix}"
        )
    return (
        f"{tag}: longest first prompt {prompt} tokens (row {row} of {rows.dataset}, question {question} tokens, {size}) "
        f"+ {turn} per turn ({limit}) fit in sequence_length {sequence_length}"
    )


# --- the model's positions ---------------------------------------------------------------------------------------
def max_positions(hf_config: Any) -> tuple[int | None, int | None, str]:
    """``(native, scaled, scaling)`` of a HF model config: ``max_position_embeddings``, the length its RoPE scaling
    reaches (``native`` without one), and a description of the scaling ("" without one)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    native = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if not isinstance(native, int):
        return None, None, ""
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    # transformers 5 keeps one set per attention type for some models (e.g. full and sliding attention)
    sets = list(params.values()) if params and all(isinstance(v, dict) for v in params.values()) else [params]
    scaled, scaling = native, ""
    for rope in sets:
        kind, factor = rope.get("rope_type") or rope.get("type"), rope.get("factor")
        if kind in (None, "default") or not isinstance(factor, int | float) or factor <= 1:
            continue
        original = rope.get("original_max_position_embeddings") or native
        reach = max(native, int(original * factor))
        if reach > scaled:
            scaled, scaling = reach, f"{kind} RoPE scaling x{factor:g} of {original}"
    return native, scaled, scaling


def _check_positions(where: str, folder: Callable[[], Path], trust_remote_code: bool, sequence_length: int) -> str:
    from transformers import AutoConfig

    try:
        path = folder()
    except NotBuiltHere as e:
        return f"{where}: sequence_length not checked against the model's positions ({e})"
    try:
        hf_config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as e:  # as above: the model checks report an unusable folder
        return f"{where}: sequence_length not checked against the model's positions ({type(e).__name__}: {e})"
    native, scaled, scaling = max_positions(hf_config)
    if native is None or scaled is None:
        return f"{where}: the model's config names no max_position_embeddings; sequence_length not checked against it"
    if sequence_length > scaled:
        reach = (
            f"{scaled} positions ({scaling}; max_position_embeddings={native})" if scaling else f"{native} positions"
        )
        raise ConfigError(
            f"{ROLL_KEY}={sequence_length} exceeds the {reach} of the model of {where} ({path}): lower "
            f"rollout.sequence_length to {scaled} or less, or use a model with a longer context"
        )
    if sequence_length > native:
        message = (
            f"warning: {ROLL_KEY}={sequence_length} is beyond the model's max_position_embeddings={native} ({where}), "
            f"within the {scaled} its {scaling} reaches; quality there depends on the model"
        )
        return message
    return f"{where}: sequence_length {sequence_length} within the model's {native} positions"


ENGINE_CONTEXT_KEYS = {"vllm": "max_model_len", "sglang": "context_length"}
"""The strategy_config key that caps an inference engine's prompt + response tokens."""


def _check_engine_context(name: str, role: RoleConfig, sequence_length: int) -> str | None:
    """An inference engine capped below ``sequence_length`` would refuse the longest turns the env managers send
    (a multi-turn episode's prompt grows up to it)."""
    strategy = role.strategy_args
    key = ENGINE_CONTEXT_KEYS.get(strategy.strategy_name) if strategy is not None else None
    limit = (strategy.strategy_config or {}).get(key) if strategy is not None and key is not None else None
    if not isinstance(limit, int) or limit >= sequence_length:
        return None
    where = f"{name}.strategy_args.strategy_config.{key}"
    raise ConfigError(
        f"{where}={limit} is below {ROLL_KEY}={sequence_length}: the engine would refuse an episode's later turns; "
        f"raise {key} to at least {sequence_length}, or lower rollout.sequence_length to {limit}"
    )


# --- the checks of a config ---------------------------------------------------------------------------------------
def _model_folder(where: str, value: str, revision: str | None) -> Path:
    """The local folder of a model reference as it can be read here (``tiny://`` presets built into the asset cache,
    as ``roll run`` builds them); ``NotBuiltHere`` where it cannot (the model checks report a bad reference)."""
    try:
        folder = readable_model_folder(where, value, revision)
    except RollError as e:
        raise NotBuiltHere(str(e)) from None
    if folder is None:
        raise NotBuiltHere(f"{where}={value!r} is only downloaded or built at run time")
    return folder


def _tokenizer_loader(role_name: str, role: RoleConfig, tokenizer: Any) -> Callable[[], Any]:
    """The tokenizer the pipeline renders prompts with, loaded once on first use."""
    from roll.pipelines.tokenizers import load_tokenizer

    @functools.cache
    def load() -> Any:
        if tokenizer is not None:
            return tokenizer
        args = role.model_args
        field = "tokenizer_name_or_path" if args.tokenizer_name_or_path else "model_name_or_path"
        folder = _model_folder(f"{role_name}.model_args.{field}", args.tokenizer_path or "", args.revision)
        try:
            return load_tokenizer(args.model_copy(update={"tokenizer_name_or_path": str(folder)}))
        except Exception as e:  # transformers has no common error type; the model checks report an unusable folder
            raise NotBuiltHere(f"the tokenizer in {folder} does not load: {type(e).__name__}: {e}") from None

    return load


def length_checks(
    config: Any,
    managers: Sequence[tuple[str, EnvManagerConfig, int, str]],
    *,
    tokenizer_role: str,
    tokenizer: Any = None,
    envs: DriverEnvs | None = None,
) -> list[Callable[[], str | None]]:
    """The checks of ``config.rollout.sequence_length``: one per model reference of ``config``'s roles, one per env
    tag of ``managers`` (``(yaml key, manager, its scheduler's base seed, its mode)``; a tag listed twice is checked
    once per turn budget: a val manager sampling longer turns than the training one on a shared tag is checked too).
    A manager's turns are sampled with its own ``generating_args``, else actor_infer's.

    ``tokenizer`` is the pipeline's own (setup); without it, ``tokenizer_role``'s is loaded where it can be read here
    (``roll validate``). ``envs``: the driver's envs, shared with the random-action checks (a tag is built once).
    Each check returns a summary line, or raises a ConfigError naming the fix.
    """
    envs = DriverEnvs() if envs is None else envs
    sequence_length = config.rollout.sequence_length
    roles: dict[str, RoleConfig] = config.roles()
    default = roles["actor_infer"].generating_args
    load = _tokenizer_loader(tokenizer_role, roles[tokenizer_role], tokenizer)
    checks: list[Callable[[], str | None]] = []
    seen: set[str] = set()
    for name, role in roles.items():
        args = role.model_args
        if not args.model_name_or_path or args.model_name_or_path in seen:
            continue
        seen.add(args.model_name_or_path)
        where = f"{name}.model_args.model_name_or_path"
        folder = functools.partial(_model_folder, where, args.model_name_or_path, args.revision)
        checks.append(functools.partial(_check_positions, where, folder, args.trust_remote_code, sequence_length))
    for name, role in roles.items():
        checks.append(functools.partial(_check_engine_context, name, role, sequence_length))
    budgets: set[tuple[str, int]] = set()
    for key, manager, seed, mode in managers:
        own = manager.generating_args is not None
        generation = manager.turn_generation(default)
        scheduler = _Scheduler(key, manager, seed, mode, generation, f"{key if own else 'actor_infer'}.generating_args")
        for plan in plan_groups(manager):
            spec = config.custom_envs[plan.tag]
            budget = (plan.tag, scheduler.turn(spec)[0])
            if budget in budgets:
                continue
            budgets.add(budget)
            first = functools.partial(_first_seed, scheduler, config.custom_envs, plan)
            checks.append(
                functools.partial(_check_first_prompt, plan.tag, spec, scheduler, first, load, sequence_length, envs)
            )
    return checks


def setup_checks(config: Any, managers: Sequence[EnvManagerConfig], model_args: Any) -> Any:
    """An agentic pipeline's checks at setup, before any worker starts: the env entries of ``managers`` (an
    ``llm_proxy`` random tag's random actions included), then ``rollout.sequence_length`` (``config.length_checks``)
    with the tokenizer of ``model_args``, which is returned. A tag's env is built once in the driver for both."""
    from roll.pipelines.tokenizers import load_tokenizer

    envs = DriverEnvs()
    try:
        for check in env_checks(config.custom_envs, managers, envs):
            check()
        tokenizer = load_tokenizer(model_args)
        run_length_checks(config.length_checks(tokenizer, envs))
    finally:
        envs.close()
    return tokenizer


def run_length_checks(checks: Sequence[Callable[[], str | None]]) -> None:
    """Run ``checks`` at a pipeline's setup: a problem raises; warnings are logged as warnings, the rest as info."""
    for check in checks:
        line = check()
        if line and line.startswith("warning: "):
            logger.warning("%s", line[len("warning: ") :])
        elif line:
            logger.info("%s", line)
