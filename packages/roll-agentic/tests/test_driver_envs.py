"""The driver builds each env tag once, within a timeout, for the start-up checks that need a built env: the
``llm_proxy`` random-action check and the first-prompt length check."""

from __future__ import annotations

import threading
import time

import pytest

from roll.agentic import driver_envs
from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.driver_envs import DriverEnvs
from roll.agentic.env import FrozenLakeEnv
from roll.agentic.pipeline import AgenticConfig
from roll.agentic.pool import check_random_actions, env_checks
from roll.runtime import ConfigError

RELEASE = threading.Event()  # lets the hung constructors' threads finish when the module's tests are done
BUILT: list[str] = []


@pytest.fixture(autouse=True)
def _reset():
    BUILT.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def make_hanging_lake() -> FrozenLakeEnv:
    """A factory function (only a built env says whether it has random actions) whose constructor hangs."""
    BUILT.append("hang")
    RELEASE.wait(30)
    return FrozenLakeEnv(size=3)


def make_counted_lake() -> FrozenLakeEnv:
    BUILT.append("lake")
    return FrozenLakeEnv(size=3)


def _config(env_type: str) -> AgenticConfig:
    """Tag ``Env`` trained with the policy and validated with llm_proxy random: both start-up checks need its env."""
    role = {"model_args": {"model_name_or_path": "/models/not-here"}}
    manager = {"num_env_groups": 1, "group_size": 1, "tags": ["Env"]}
    return AgenticConfig.model_validate(
        {
            "actor_train": role,
            "actor_infer": {**role, "generating_args": {"max_new_tokens": 16}},
            "custom_envs": {"Env": {"env_type": env_type, "max_tokens_per_step": 16}},
            "train_env_manager": manager,
            "val_env_manager": {**manager, "llm_proxy": {"proxy_type": "random"}},
            "rollout_batch_size": 1,
            "advantage": {"estimator": "reinforce"},
        }
    )


def _run(config: AgenticConfig, tokenizer, envs: DriverEnvs) -> list[str]:
    checks = [*env_checks(config.custom_envs, config.env_managers(), envs), *config.length_checks(tokenizer, envs)]
    lines = [line for check in checks if (line := check())]
    envs.close()
    return lines


def test_a_hanging_constructor_is_given_up_on_within_the_timeout_by_tag() -> None:
    spec = CustomEnvConfig(env_type=f"{__name__}:make_hanging_lake")
    start = time.monotonic()
    line = check_random_actions("Hang", spec, DriverEnvs(timeout_s=0.3))
    assert time.monotonic() - start < 3
    assert line == "Hang: random actions not checked here (building its env took over 0.3 s)"


def test_a_hanging_env_holds_the_start_up_checks_once_not_per_check(tokenizer) -> None:
    config = _config(f"{__name__}:make_hanging_lake")
    start = time.monotonic()
    lines = _run(config, tokenizer, DriverEnvs(timeout_s=0.5))
    assert time.monotonic() - start < 5  # within the guard: the constructor would hang for 30 s
    assert BUILT == ["hang"]  # one build, given up on once: the length check does not wait for it again
    assert "Env: random actions not checked here (building its env took over 0.5 s)" in lines
    assert "Env: first prompt not checked here (building its env took over 0.5 s); its first turn checks it" in lines


def test_the_random_action_and_length_checks_build_the_env_once(tokenizer) -> None:
    config = _config(f"{__name__}:make_counted_lake")
    lines = _run(config, tokenizer, DriverEnvs())
    assert BUILT == ["lake"]
    assert f"Env: env_type '{__name__}:make_counted_lake' has sample_random_action() for llm_proxy random" in lines
    assert any(line.startswith("Env: first prompt ") and "fit in sequence_length" in line for line in lines)
    # each check on its own still builds what it needs
    BUILT.clear()
    assert check_random_actions("Env", config.custom_envs["Env"]) is not None and BUILT == ["lake"]


def test_deployment_checks_share_one_build_and_close_what_is_left(tokenizer, monkeypatch) -> None:
    closed: list[str] = []
    monkeypatch.setattr(FrozenLakeEnv, "close", lambda self: closed.append("closed"), raising=False)
    config = _config(f"{__name__}:make_counted_lake")
    checks = config.deployment_checks()
    assert checks[-1].__self__.__class__ is DriverEnvs  # the last check closes the driver's envs
    manager = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Env"], llm_proxy={"proxy_type": "random"})
    envs = DriverEnvs()
    env_checks(config.custom_envs, [manager], envs)[-1]()
    assert BUILT == ["lake"] and not closed
    envs.close()
    assert closed == ["closed"]


def make_unreachable_lake() -> FrozenLakeEnv:
    BUILT.append("unreachable")
    raise ConnectionError("no route to the env's service")


def test_a_failed_build_is_remembered_not_retried() -> None:
    envs = DriverEnvs()
    spec = CustomEnvConfig(env_type=f"{__name__}:make_unreachable_lake")
    for _ in range(2):
        with pytest.raises(driver_envs.NotBuiltHere, match=r"^building its env failed: ConnectionError: no route"):
            envs.get("Bad", spec)
    with pytest.raises(driver_envs.NotBuiltHere, match=r"^building its env failed: "):
        envs.get("Bad", CustomEnvConfig(env_type=f"{__name__}:make_counted_lake"))
    assert BUILT == ["unreachable"]


def test_an_env_refusing_its_settings_fails_the_check_by_tag_not_skips_it(tokenizer) -> None:
    """``roll validate`` said OK for ``frozen_lake`` with ``size: -3`` (the build's ConfigError was only "not checked
    here"); every worker would refuse it the same way, so the check fails, naming the tag, once."""
    config = _config("frozen_lake")
    config.custom_envs["Env"].env_config = {"size": -3}
    envs = DriverEnvs()
    with pytest.raises(ConfigError, match=r"^env tag 'Env' \(frozen_lake\): frozen_lake size=-3 is too small"):
        _run(config, tokenizer, envs)
    with pytest.raises(ConfigError, match=r"^env tag 'Env'"):  # remembered: not built again
        envs.get("Env", CustomEnvConfig(env_type=f"{__name__}:make_counted_lake"))
    assert BUILT == []
