"""Environments of the ``gem-llm`` package (games, math, code, QA, reasoning-gym) by their GEM ids.

Needs the extra: ``pip install 'roll-agentic[gem]'``. GEM's envs already speak the contract of
:mod:`roll.agentic.env.base`; this adapter adds what roll's env managers read: ``info["success"]`` (GEM reports
none: its ``info["correct"]`` where it has one, else a terminated episode whose last reward reaches ``success_reward``
counts as solved) and ``uses_global_rng`` (GEM seeds and draws from the process-global ``random``/``numpy``
generators).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import random
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from roll.agentic.env.base import Env, ResetOutput, StepOutput, check_reset_output, check_step_output
from roll.runtime import ConfigError, import_extra, import_target

__all__ = ["LEGACY_GEM_IDS", "GemEnv", "check_gem_env", "gem_dataset", "gem_env_ids", "import_gem"]


# GEM ids that gem-llm 0.1 dropped when it split its games into -easy/-hard/-random variants, each with the class and
# settings gem-llm 0.0.4 registered it with. ROLL's examples (qwen3_agentic_gem/gem_game_guess_the_number.yaml) and
# recipes written for GEM before 0.1 name them; roll registers the ones the installed gem-llm lacks, so such a config
# plays the game it was written for (its env_config still overrides each setting).
LEGACY_GEM_IDS: dict[str, tuple[str, dict[str, Any]]] = {
    "game:GuessTheNumber-v0": (
        "gem.envs.game_env.guess_the_number:GuessTheNumberEnv",
        {"min_number": 1, "max_number": 20, "max_turns": 10},
    ),
    "game:GuessTheNumber-v0-hard-no-max-turn": (
        "gem.envs.game_env.guess_the_number:GuessTheNumberEnv",
        {"min_number": 1, "max_number": 50, "max_turns": 50},
    ),
    "game:Mastermind-v0": (
        "gem.envs.game_env.mastermind:MastermindEnv",
        {"code_length": 4, "num_numbers": 6, "max_turns": 20, "duplicate_numbers": False},
    ),
    "game:Minesweeper-v0": (
        "gem.envs.game_env.minesweeper:MinesweeperEnv",
        {"rows": 8, "cols": 8, "num_mines": 10, "max_turns": 100},
    ),
    "game:Minesweeper-v0-very-easy": (
        "gem.envs.game_env.minesweeper:MinesweeperEnv",
        {"rows": 3, "cols": 3, "num_mines": 1, "max_turns": 10},
    ),
    "game:Wordle-v0": (
        "gem.envs.game_env.wordle:WordleEnv",
        {"word_length": 5, "only_real_words": True, "max_turns": 15},
    ),
    "game:FifteenPuzzle-v0": ("gem.envs.game_env.fifteen_puzzle:FifteenPuzzleEnv", {"num_rows": 3, "max_turns": 20}),
    "game:Hangman-v0": ("gem.envs.game_env.hangman:HangmanEnv", {"word_length": 5, "hardcore": False, "max_turns": 15}),
    "game:Sudoku-v0-easy-v2": (
        "gem.envs.game_env.sudoku:SudokuEnv",
        {"clues": 10, "max_turns": 15, "scale": 4, "invalid_action_reward_type": "v2"},
    ),
    "game:Sudoku-v0": ("gem.envs.game_env.sudoku:SudokuEnv", {"clues": 50, "max_turns": 50, "scale": 9}),
    "game:TowerofHanoi-v0": ("gem.envs.game_env.tower_of_hanoi:TowerofHanoiEnv", {"num_disks": 4, "max_turns": 20}),
}


def import_gem() -> Any:
    """The ``gem`` module (with :data:`LEGACY_GEM_IDS` registered), or MissingExtraError with the pip command that
    installs it."""
    gem = import_extra("gem", "a GEM environment", "roll-agentic", "gem")
    _register_legacy_ids()
    return gem


_REGISTERING = threading.Lock()  # env workers build their envs on threads of their own


def _register_legacy_ids() -> None:
    from gem.envs.registration import ENV_REGISTRY, register

    with _REGISTERING:
        for env_id, (entry_point, settings) in LEGACY_GEM_IDS.items():
            if env_id not in ENV_REGISTRY:
                register(env_id, entry_point, **settings)


def gem_env_ids() -> list[str]:
    """Every env id registered with GEM."""
    import_gem()
    from gem.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


def check_gem_env(env_id: str, kwargs: Mapping[str, Any]) -> None:
    """ConfigError unless ``env_id`` is a GEM id and its env class names every key of ``kwargs``. GEM's game envs take
    ``**_`` and drop the keys they do not know, so a misspelled ``env_config`` key would otherwise be ignored."""
    ids = gem_env_ids()
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
        hint = f"did you mean {close}?" if close else f"GEM knows e.g. {ids[:8]} ..."
        raise ConfigError(f"unknown GEM env id {env_id!r}; {hint}")
    from gem.envs.registration import ENV_REGISTRY

    entry = ENV_REGISTRY[env_id].entry_point
    try:
        env_cls = import_target(entry) if isinstance(entry, str) else entry
        parameters = list(inspect.signature(env_cls).parameters.values())
    except (ImportError, AttributeError, TypeError, ValueError):
        return  # gem.make reports it
    named = [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if any(p.kind is p.VAR_KEYWORD and not p.name.startswith("_") for p in parameters):
        return  # passed on to code we cannot see
    unknown = sorted(set(kwargs) - set(named))
    if unknown:
        raise ConfigError(
            f"env_config keys {unknown} are not settings of GEM env {env_id!r} "
            f"({getattr(env_cls, '__name__', env_cls)} would ignore them); accepted: {[*named, 'success_reward']}"
        )


class GemEnv(Env):
    """One GEM environment, made with ``gem.make(env_id, **kwargs)``."""

    uses_global_rng = True

    def __init__(self, env_id: str, success_reward: float = 1.0, **kwargs: Any) -> None:
        gem = import_gem()
        check_gem_env(env_id, kwargs)
        self.env_id = env_id
        self.success_reward = success_reward
        self.env = gem.make(env_id, **kwargs)

    def reset(self, seed: int | None = None) -> ResetOutput:
        observation, info = check_reset_output(self.env.reset(seed=seed))
        info.setdefault("success", False)
        return observation, info

    def step(self, action: str) -> StepOutput:
        observation, reward, terminated, truncated, info = check_step_output(self.env.step(action))
        if "success" not in info:
            # GEM's single-turn envs (math, qa, code, reasoning-gym) end every answer terminated *and* truncated;
            # its games end at max_turns the same way, with a partial reward below success_reward.
            correct = info.get("correct")  # math and qa report it
            info["success"] = bool(correct) if correct is not None else terminated and reward >= self.success_reward
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def sample_random_action(self, seed: int | None = None) -> str:
        """GEM's random action. GEM's method takes no seed and draws from the process-global ``random`` (and
        ``numpy.random``): with ``seed`` (the turn's) both are seeded with it for the call and put back after, so the
        action is a function of the seed and the episode's own draws (2048's new tiles) do not move. Without one it
        draws from where the episode's draws left them, as in GEM. A GEM env whose sampler keeps a generator of its
        own stays unseeded either way (GEM's own envs have none)."""
        if seed is None:
            return self.env.sample_random_action()
        saved = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed)
        try:
            return self.env.sample_random_action()
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])


def gem_dataset(factory: Any, env_config: Mapping[str, Any]) -> str | None:
    """The hub dataset a GEM env loads when it is built (``env_config``'s ``dataset_name``, else the one its id is
    registered with), for the factory the env registry resolves a GEM id to (``partial(GemEnv, env_id)``); None for
    any other factory, and for GEM envs without a dataset (games, reasoning-gym)."""
    if not (isinstance(factory, functools.partial) and factory.func is GemEnv and factory.args):
        return None
    import_gem()
    from gem.envs.registration import ENV_REGISTRY

    entry = ENV_REGISTRY.get(factory.args[0])
    name = env_config.get("dataset_name") or (entry.kwargs.get("dataset_name") if entry is not None else None)
    return str(name) if name else None
