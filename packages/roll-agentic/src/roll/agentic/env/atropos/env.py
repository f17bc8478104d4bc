"""ROLL's ``atropos_env``: an environment class of Nous Research's Atropos (``atroposlib``) played as a roll env.

Needs the extra: ``pip install 'roll-agentic[atropos]'``. ``env_config`` keys, as ROLL's ``AtroposEnv`` reads them:

* ``atropos_env_path``: the Atropos env class, ``"module:Class"``, a subclass of ``atroposlib.envs.base.BaseEnv``.
  Atropos's own environments (``environments.gsm8k_server:GSM8kEnv``) live in the atropos repository, not in the
  ``atroposlib`` wheel: put a checkout of it on ``PYTHONPATH`` (ROLL adds ``/workspace/atropos`` to ``sys.path``;
  roll changes no import path).
* ``env_config``: settings of the Atropos env's config class, over the defaults of its ``config_init()`` (e.g.
  ``tokenizer_name``, ``max_token_length``); a key that class does not have is an error. ``group_size`` is 1 (roll
  samples one response per episode; GRPO groups come from the env manager's ``group_size``): another value is an
  error. ``tokenizer_name`` is loaded when the env is built; with no model hub, name a local folder (the policy's).
* ``max_steps``: most turns (model responses) per episode (default 16); the turn that reaches it is truncated.
* ``reward_config``: the reward of an episode the Atropos env does not score above 0 (see below): ``format_markers``
  (a list of ``{marker, reward}``; default ``<think>`` 0.2 and ``\\boxed{`` 0.3) and ``length_bounty_max``
  (default 0.2).
* ``debug``: log each task and response (INFO).

An episode: ``reset(seed)`` takes the Atropos env's next item (``get_next_item()``; ``seed`` seeds Python's
``random`` and NumPy's global generator first, so an env that draws its item at random draws by seed and the members
of a GRPO group, which share a seed, get one item; an env that walks its data in order, as GSM8kEnv does, gives every
env slot its items in that one order, so as in ROLL all groups of a rollout step ask the same item) and runs the env's
``collect_trajectories(item)`` up to its first model call: the messages (and tools) it sends are the observation. A
``step(response)`` runs the trajectory again from the item with the episode's responses so far as the model's answers
(:mod:`roll.agentic.env.atropos._bridge`): if the env calls the model once more, that call's messages are the next
observation (reward 0); when it finishes, the episode ends with the first score of what it returned (its
``ScoredDataGroup``). As in ROLL, a score above 0 is the reward; otherwise (no score, or one <= 0) the reward is
``-1 + the rewards of the format_markers found in the last response + min(len(response) / 1000,
length_bounty_max)``. Atropos envs that drop groups whose scores are all equal (GSM8kEnv does) return no group for a
single response, so their episodes earn only that shaped reward. ``info``: ``success`` (scored above 0),
``atropos_score`` (the score, or None), ``metrics.atropos_scored`` (1 when the env returned a score).

The observations are chat message lists: play it with ``env_manager_cls: agent_native`` (ROLL's
``AgentNativeStepEnvManager``, as ROLL's example does). Replaying a turn re-runs the env's code from the item, with
Python's and NumPy's global generators as the first run left them after ``get_next_item`` (so its random draws repeat);
an env whose tool results change from run to run (a clock, a live service) can still show a later turn a different
history.

Differences from ROLL's adapter: ROLL reads ``reward_config`` through an attribute its gem base class does not have
(its steps then end in its error path, reward 0), and its stand-in server hands the response to the env as character
codes that the env's tokenizer decodes into other text; here the response reaches the env as written. ROLL answers
every model call of a turn with the turn's response, so a later turn restarts the trajectory with only the newest
response; here every earlier response is replayed in order. A failing reset or step raises (the runner ends the
episode with ``env_error``) instead of returning a placeholder observation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from roll.runtime import ConfigError, RollError, RollModel, import_extra, import_target
from roll.runtime.config import validation_error_lines

__all__ = ["AtroposEnv", "AtroposRewardConfig", "FormatMarker", "episode_reward", "first_score", "import_atropos"]

logger = logging.getLogger(__name__)


def import_atropos() -> Any:
    """The ``atroposlib`` module, or MissingExtraError with the pip command that installs it."""
    what = "Atropos environments (atropos_env)"
    atroposlib = import_extra("atroposlib", what, "roll-agentic", "atropos")
    import_extra("atroposlib.envs.base", what, "roll-agentic", "atropos")  # read as atroposlib.envs.base
    return atroposlib


class FormatMarker(RollModel):
    marker: str = Field(description="Text whose presence in the response earns `reward`.")
    reward: float


class AtroposRewardConfig(RollModel):
    """ROLL's ``reward_config``: the reward of an episode the Atropos env does not score above 0."""

    format_markers: list[FormatMarker] = Field(
        default_factory=lambda: [
            FormatMarker(marker="<think>", reward=0.2),
            FormatMarker(marker="\\boxed{", reward=0.3),
        ]
    )
    length_bounty_max: float = Field(default=0.2, description="Most of the length bonus, len(response) / 1000.")


def first_score(result: Any) -> float | None:
    """The first score of what ``collect_trajectories`` returned (a ScoredDataGroup, a list of them, or None)."""
    for group in result if isinstance(result, list) else [result]:
        scores = group.get("scores") if isinstance(group, Mapping) else None
        if scores:
            return float(scores[0])
    return None


def episode_reward(score: float | None, response: str, config: AtroposRewardConfig) -> float:
    """``score`` when it is above 0, else ROLL's shaped reward of the last ``response``."""
    if score is not None and score > 0:
        return score
    bonus = sum(m.reward for m in config.format_markers if m.marker in response)
    return -1.0 + bonus + min(len(response) / 1000.0, config.length_bounty_max)


def _load_env_class(path: str) -> Any:
    atroposlib = import_atropos()
    setting = "env_config.atropos_env_path"
    if not isinstance(path, str) or ":" not in path:
        raise ConfigError(f"{setting}={path!r} must name the Atropos env class as 'module:Class'")
    try:
        cls = import_target(path, setting)
    except ConfigError as e:
        hint = ""
        if path.startswith("environments."):
            hint = (
                "; Atropos's environments/ folder is not part of the atroposlib package: put a checkout of the "
                "atropos repository on PYTHONPATH"
            )
        raise type(e)(f"{e}{hint}") from e
    if not (isinstance(cls, type) and issubclass(cls, atroposlib.envs.base.BaseEnv)):
        raise ConfigError(f"{setting}={path!r} is {cls!r}, not a subclass of atroposlib.envs.base.BaseEnv")
    return cls


def _atropos_config(cls: Any, env_config: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """The Atropos env's config (its ``config_init()`` defaults, group_size 1, then ``env_config``) and servers."""
    settings = dict(env_config or {})
    base, servers = cls.config_init()
    config_cls = type(base)
    unknown = sorted(set(settings) - set(config_cls.model_fields))
    if unknown:
        raise ConfigError(
            f"env_config.env_config keys {unknown} are not settings of {cls.__name__}'s config "
            f"({config_cls.__name__}); accepted: {sorted(config_cls.model_fields)}"
        )
    if settings.get("group_size", 1) != 1:
        raise ConfigError(
            f"env_config.env_config.group_size={settings['group_size']!r}: roll samples one response per episode; "
            "set it to 1 or leave it out (GRPO groups come from the env manager's group_size)"
        )
    from pydantic import ValidationError

    try:
        config = config_cls.model_validate({**base.model_dump(), "group_size": 1, **settings})
    except ValidationError as e:
        lines = "; ".join(validation_error_lines(e, root="env_config.env_config"))
        raise ConfigError(f"{lines} ({config_cls.__name__}, the config of {cls.__name__})") from None
    return config, servers


def _reward_config(reward_config: Mapping[str, Any] | None) -> AtroposRewardConfig:
    try:
        return AtroposRewardConfig(**dict(reward_config or {}))
    except ConfigError as e:
        raise ConfigError(f"env_config.reward_config: {e}") from None


class AtroposEnv:
    """One Atropos env instance played turn by turn; observations are chat message lists."""

    #: reset() seeds Python's and NumPy's global generators before the Atropos env draws its item.
    uses_global_rng = True

    def __init__(
        self,
        atropos_env_path: str,
        max_steps: int = 16,
        env_config: dict[str, Any] | None = None,
        reward_config: dict[str, Any] | None = None,
        debug: bool = False,
    ) -> None:
        if max_steps < 1:
            raise ConfigError(f"atropos_env max_steps={max_steps} must be >= 1")
        self.reward_config = _reward_config(reward_config)
        cls = _load_env_class(atropos_env_path)
        config, servers = _atropos_config(cls, env_config)
        self.atropos_env_path, self.max_steps, self.debug = atropos_env_path, max_steps, debug
        try:
            # testing=True: Atropos then starts no server clients (the replay server answers every model call).
            self.env = cls(config=config, server_configs=servers, slurm=False, testing=True)
        except OSError as e:  # transformers' error for a tokenizer it cannot find or download
            raise ConfigError(
                f"atropos_env {atropos_env_path}: its tokenizer {config.tokenizer_name!r} does not load ({e}); set "
                "env_config.env_config.tokenizer_name to a local tokenizer folder (e.g. the policy's)"
            ) from e
        self._loop = asyncio.new_event_loop()
        self._run(self.env.setup())
        self.item: Any = None
        self.responses: list[str] = []
        self._replay_rng: tuple[Any, Any] = (random.getstate(), np.random.get_state())
        self.messages: list[dict[str, Any]] = []

    @classmethod
    def check_args(cls, **env_config: Any) -> str:
        """``roll validate``: atroposlib is installed, the env class resolves, and its settings fit its config."""
        import inspect

        args = inspect.signature(cls).bind(**env_config).arguments
        _reward_config(args.get("reward_config"))
        env_class = _load_env_class(args["atropos_env_path"])
        _atropos_config(env_class, args.get("env_config"))
        return f"Atropos env {env_class.__name__}"

    def _run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the env's own loop (Atropos envs may keep loop-bound state between calls); from a
        thread that already runs a loop, on a helper thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coroutine)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="roll-atropos") as pool:
            return pool.submit(self._loop.run_until_complete, coroutine).result()

    def _replay(self) -> Any:
        from roll.agentic.env.atropos._bridge import replay

        # Every replay draws what the first one drew: an env that draws in collect_trajectories (shuffled options, a
        # random operand) must grade a later turn against the prompt the model was shown, not against new draws.
        random.setstate(self._replay_rng[0])
        np.random.set_state(self._replay_rng[1])
        return self._run(replay(self.env, self.item, self.responses))

    def reset(self, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed % 2**32)
        self.item = self._run(self.env.get_next_item())
        self.responses = []
        self._replay_rng = (random.getstate(), np.random.get_state())
        turn = self._replay()
        if turn.asked is None:
            raise RollError(
                f"atropos_env {self.atropos_env_path}: collect_trajectories finished without asking the model for a "
                f"response (item {str(self.item)[:120]!r}); roll plays envs that ask for one"
            )
        self.messages = turn.asked
        if self.debug:
            logger.info("atropos_env %s: task %s", self.atropos_env_path, str(self.messages[-1].get("content"))[:200])
        return list(self.messages), {"tools": turn.tools, "success": False}

    def step(self, action: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        if self.item is None:
            raise RollError(f"atropos_env {self.atropos_env_path}: step() called before reset()")
        self.responses.append(action)
        if self.debug:
            logger.info("atropos_env %s: turn %d response %s", self.atropos_env_path, len(self.responses), action[:200])
        turn = self._replay()
        truncated = len(self.responses) >= self.max_steps
        if turn.asked is not None:  # the env wants another response: the next turn
            self.messages = turn.asked
            info: dict[str, Any] = {"success": False, "atropos_score": None, "metrics": {"atropos_scored": 0.0}}
            return list(self.messages), 0.0, False, truncated, info
        score = first_score(turn.result)
        reward = episode_reward(score, action, self.reward_config)
        self.messages = [*self.messages, {"role": "assistant", "content": action}]
        info = {
            "success": score is not None and score > 0,
            "atropos_score": score,
            "metrics": {"atropos_scored": float(score is not None)},
        }
        if self.debug:
            logger.info("atropos_env %s: score %s, reward %.3f", self.atropos_env_path, score, reward)
        return list(self.messages), reward, True, False, info

    def close(self) -> None:
        writer = getattr(getattr(self, "env", None), "jsonl_writer", None)
        if writer is not None:
            writer.close()
        loop = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.close()
