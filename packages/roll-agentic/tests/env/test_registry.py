"""make_env: registered names, user classes by import path, GEM ids, and clear errors."""

from __future__ import annotations

import sys

import pytest

from roll.agentic.env import ENVS, FrozenLakeEnv, check_env, make_env, register_env
from roll.runtime import ConfigError


class CountdownEnv:
    """A user's env that does not inherit from roll's base class: counts down from the seed."""

    def __init__(self, start: int = 3) -> None:
        self.start, self.value = start, start

    def reset(self, seed=None):
        self.value = self.start + (seed or 0) % 3
        return f"value {self.value}", {}

    def step(self, action):
        self.value -= 1
        return f"value {self.value}", float(self.value == 0), self.value == 0, False, {"success": self.value == 0}


def test_builtin_names() -> None:
    assert {"frozen_lake", "sokoban", "arithmetic", "tool_math"} <= set(ENVS.names())
    assert isinstance(make_env("frozen_lake", size=3), FrozenLakeEnv)


def test_user_env_by_import_path() -> None:
    env = make_env(f"{__name__}:CountdownEnv", start=2)
    assert env.reset(seed=1) == ("value 3", {})
    env_dotted = make_env(f"{__name__}.CountdownEnv")
    assert isinstance(env_dotted, sys.modules[__name__].CountdownEnv)


def test_register_env_and_duplicate() -> None:
    register_env("countdown_test", CountdownEnv)
    assert isinstance(make_env("countdown_test"), CountdownEnv)
    with pytest.raises(ConfigError, match="already registered"):
        register_env("countdown_test", CountdownEnv)


def test_bad_env_config_lists_accepted_keys() -> None:
    with pytest.raises(ConfigError, match="accepted keys: .*'size'"):
        make_env("frozen_lake", sizee=4)


def test_unknown_env_type() -> None:
    with pytest.raises(ConfigError, match="unknown env_type 'frozen_lak'.*frozen_lake"):
        make_env("frozen_lak")


@pytest.mark.parametrize("env_type", ["webshop", "deepeyes"])
def test_rolls_env_types_that_roll_does_not_build_say_so(env_type: str) -> None:
    with pytest.raises(ConfigError, match=rf"env_type '{env_type}' is one of ROLL's envs that roll does not build: .*"):
        make_env(env_type)


def test_not_an_env() -> None:
    with pytest.raises(ConfigError, match="no reset"):
        make_env("collections:OrderedDict")


@pytest.mark.extra("gem")
def test_gem_env_by_id() -> None:
    pytest.importorskip("gem")
    env = make_env("game:GuessTheNumber-v0-easy")
    prefixed = make_env("gem:game:GuessTheNumber-v0-easy")
    first, _ = env.reset(seed=7)
    assert prefixed.reset(seed=7)[0] == first and "Guess The Number" in first
    assert env.uses_global_rng
    # Binary search always finds the number within the easy game's budget; success is derived from the reward.
    low, high = 1, 10
    for _ in range(10):
        guess = (low + high) // 2
        observation, reward, terminated, _truncated, info = env.step(f"\\boxed{{{guess}}}")
        if terminated:
            break
        if "higher" in observation:
            low = guess + 1
        else:
            high = guess - 1
    assert terminated and reward == 1.0 and info["success"] is True


@pytest.mark.extra("gem")
def test_gem_unknown_id() -> None:
    pytest.importorskip("gem")
    with pytest.raises(ConfigError, match="unknown GEM env id"):
        make_env("gem:game:NoSuchGame-v0")


class ExpensiveEnv(CountdownEnv):
    def __init__(self, start: int = 3) -> None:
        raise AssertionError("check_env must not build the env")


def test_check_env_fits_env_config_without_building() -> None:
    assert check_env(f"{__name__}:ExpensiveEnv", {"start": 2}) is ExpensiveEnv
    with pytest.raises(
        ConfigError, match=r"env_config for env_type .*ExpensiveEnv.*'strat'.*accepted keys: \['start'\]"
    ):
        check_env(f"{__name__}:ExpensiveEnv", {"strat": 2})
    with pytest.raises(ConfigError, match="gives a OrderedDict, which has no reset"):
        check_env("collections:OrderedDict", {})


def test_rolls_env_types_marked_built_in_are_registered() -> None:
    """docs/roll-compat.md's table of ROLL env types stays true: each one it calls built in resolves here."""
    import re

    from roll.agentic.env import ENVS
    from roll.pipelines.compat.notes import ROLL_ENV_TYPES

    built = [re.sub(r"`", "", name) for name, what in ROLL_ENV_TYPES if what.startswith("built in")]
    assert {"roll_math", "roll_qa", "roll_code"} <= set(built)
    assert [name for name in built if name not in ENVS] == []


# --- a user's env module that fails while importing ----------------------------------------------------------------
def _module(folder, name: str, source: str) -> str:
    (folder / f"{name}.py").write_text(source)
    return str(folder / f"{name}.py")


def test_a_syntax_error_in_a_user_env_module_names_the_field_file_and_line(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _module(tmp_path, "roll_test_broken_env", "class MyEnv:\n    def reset(self, seed=None)\n        pass\n")
    with pytest.raises(ConfigError) as caught:
        check_env("roll_test_broken_env:MyEnv", {}, setting="custom_envs.Mine.env_type")
    assert str(caught.value) == (
        f"custom_envs.Mine.env_type='roll_test_broken_env:MyEnv': its module roll_test_broken_env does not import "
        f"({path}, line 2: SyntaxError: expected ':'); fix the module"
    )
    assert isinstance(caught.value.__cause__, SyntaxError)
    with pytest.raises(ConfigError, match=r"^env_type='roll_test_broken_env.MyEnv': its module roll_test_broken_env "):
        make_env("roll_test_broken_env.MyEnv")  # the dotted form; without a field, the key itself


def test_an_import_error_inside_a_user_env_module_names_where_it_was_raised(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    outer = _module(tmp_path, "roll_test_outer_env", "import os\nimport roll_test_inner_dep\n\nclass MyEnv: ...\n")
    inner = _module(tmp_path, "roll_test_inner_dep", "x = 1\nimport roll_test_not_installed\n")
    with pytest.raises(ConfigError) as caught:
        check_env("roll_test_outer_env:MyEnv", {}, setting="custom_envs.Mine.env_type")
    assert str(caught.value) == (
        f"custom_envs.Mine.env_type='roll_test_outer_env:MyEnv': its module roll_test_outer_env does not import "
        f"({inner}, line 2 (imported from {outer}, line 2): ModuleNotFoundError: No module named "
        "'roll_test_not_installed'); install what it imports, or fix the module"
    )
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)
    _module(tmp_path, "roll_test_raising_env", "raise RuntimeError('needs ENV_HOME')\n")
    with pytest.raises(ConfigError, match=r"line 1: RuntimeError: needs ENV_HOME\); fix the module$"):
        check_env("roll_test_raising_env:MyEnv", {})


def test_a_path_that_names_no_module_is_still_a_path_error() -> None:
    with pytest.raises(ConfigError, match=r"env_type 'roll.agentic.no_such_module:Env' cannot be imported .*check"):
        make_env("roll.agentic.no_such_module:Env")


def test_roll_validate_names_the_custom_envs_entry_of_a_module_that_does_not_import(tmp_path, monkeypatch) -> None:
    from roll.agentic.config import CustomEnvConfig
    from roll.agentic.pool import check_env_spec

    monkeypatch.syspath_prepend(str(tmp_path))
    path = _module(tmp_path, "roll_test_broken_spec_env", "def make(:\n    pass\n")
    spec = CustomEnvConfig.model_validate({"env_type": "roll_test_broken_spec_env:make"})
    with pytest.raises(ConfigError) as caught:
        check_env_spec("Mine", spec)
    assert str(caught.value).startswith(
        f"custom_envs.Mine.env_type='roll_test_broken_spec_env:make': its module roll_test_broken_spec_env does not "
        f"import ({path}, line 1: SyntaxError: "
    )
    assert isinstance(caught.value.__cause__, SyntaxError)


@pytest.mark.parametrize("env_id", ["math:GSM8K", "code:CodeContest"])
def test_without_gem_a_gem_id_that_reads_as_a_module_path_names_the_pip_command(monkeypatch, env_id) -> None:
    monkeypatch.setitem(sys.modules, "gem", None)  # "math" and "code" are stdlib modules: the id reads as a path
    with pytest.raises(ConfigError, match=r"if it is a GEM id, install GEM: pip install 'roll-agentic\[gem\]'"):
        check_env(env_id, {})
