"""ROLL's rock_tb_native_env against a fake ROCK sandbox at the SandboxClient boundary (a scripted agent:
roll.agentic.env.rock.testing.ScriptedRockSandbox)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env import make_env
from roll.agentic.env.rock.checks import rock_checks
from roll.agentic.env.rock.testing import BASH_TOOL as BASH
from roll.agentic.env.rock.testing import ScriptedRockSandbox as FakeSandbox
from roll.agentic.env.rock.testing import write_tasks
from roll.runtime import ConfigError, MissingExtraError

NATIVE = "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager"
LS = "Let me look.<tool_call><function=bash><parameter=command>ls /testbed</parameter></function></tool_call>"


@pytest.fixture
def rock(tmp_path: Path):
    """env_config for rock_tb_native_env on a task file of two tasks and their test folders, with the fake."""
    FakeSandbox.made.clear()
    FakeSandbox.scenario = {}
    return {**write_tasks(tmp_path), "mode": "val", "max_steps": 5}


def test_an_episode_relays_turns_and_the_tests_give_the_reward(rock) -> None:
    env = make_env("rock_tb_native_env", **rock)
    messages, info = env.reset(seed=1)  # val: the first seed takes the first task
    box = FakeSandbox.made[0]
    assert box.image == "swebench/sweb.eval:t1" and box.prompts == ["Fix bug 1"]
    assert messages[-1] == {"role": "user", "content": "Fix bug 1"} and info["tools"] == [BASH]
    assert box.config.rock_agent_config()["run_cmd"] == "iflow -p ${prompt} --yolo"
    messages, reward, terminated, truncated, info = env.step(LS)
    assert box.commands == ["ls /testbed"] and messages[-1] == {"role": "tool", "content": "ran: ls /testbed"}
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "bash" and info["action_is_valid"]
    assert (reward, terminated, truncated, box.stopped) == (0.0, False, False, 0)
    messages, reward, terminated, truncated, info = env.step("Done, the bug is fixed.")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert box.uploads == ["/tests/t1_tests.tar.gz", "/tests/run-tests.sh"]
    assert box.runs[-1] == "cd /testbed && bash /tests/run-tests.sh" and box.stopped == 1
    assert info["metrics"]["raw_reward"] == 1.0 and info["metrics"]["task_id"] == 1.0


def test_tasks_val_walks_in_order_train_draws_by_seed(rock) -> None:
    from roll.agentic.env.rock.config import RockEnvConfig, TaskSet

    val = TaskSet(RockEnvConfig.model_validate(rock))
    again = TaskSet(RockEnvConfig.model_validate(rock))  # another env of the process: the same cursor
    assert [val.pick(s)["id"] for s in (50, 8)] + [again.pick(s)["id"] for s in (50, 3)] == [1, 2, 1, 1]
    train = TaskSet(RockEnvConfig.model_validate({**rock, "mode": "train", "train_idx_range": [2, 2]}))
    assert {train.pick(s)["id"] for s in range(10)} == {2}  # [start, end] includes end; only task 2 is in range
    both = TaskSet(RockEnvConfig.model_validate({**rock, "mode": "train"}))
    assert [both.pick(s)["id"] for s in range(20)] == [both.pick(s)["id"] for s in range(20)]
    assert {both.pick(s)["id"] for s in range(20)} == {1, 2}


def test_failed_tests_give_zero_and_stop_the_sandbox(rock) -> None:
    FakeSandbox.scenario = {"test_log": "test session starts\n2 PASSED 1 FAILED"}
    env = make_env("rock_tb_native_env", **rock)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("I give up.")
    assert (reward, terminated, info["success"], FakeSandbox.made[0].stopped) == (0.0, True, False, 1)


def test_a_sandbox_fault_in_the_tests_fails_the_episode_not_the_run(rock) -> None:
    FakeSandbox.scenario = {"tests_raise": True}
    env = make_env("rock_tb_native_env", **rock)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("Done.")
    assert (reward, terminated, FakeSandbox.made[0].stopped) == (0.0, True, 1)
    assert info["failure_mode"].startswith("unknown_test_error: ConnectionError")


def test_the_turn_limit_truncates_and_still_runs_the_tests(rock) -> None:
    env = make_env("rock_tb_native_env", **{**rock, "max_steps": 2})
    env.reset(seed=0)
    assert env.step(LS)[2:4] == (False, False)
    _, reward, terminated, truncated, _ = env.step(LS)
    assert (reward, terminated, truncated, FakeSandbox.made[0].stopped) == (1.0, True, True, 1)


@pytest.mark.parametrize("later", ["asks", "ends"])
def test_a_later_session_that_asks_nothing_keeps_the_tests_verdict(rock, later: str) -> None:
    """max_multi_session_num 2: the first session ends, the tests pass, and a second session starts on their output;
    if that agent sends no request, the episode ends with the passing verdict (it used to read as a failure)."""
    FakeSandbox.scenario = {"later_sessions_end": later == "ends"}
    env = make_env("rock_tb_native_env", **{**rock, "max_multi_session_num": 2})
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step("Done, the bug is fixed.")
    box = FakeSandbox.made[0]
    assert len(box.prompts) == 2 and box.prompts[1] == info["test_output"]  # the second session saw the tests
    if later == "asks":
        assert (reward, terminated, box.stopped) == (0.0, False, 0)  # rewarded when the episode ends
        _, reward, terminated, _, info = env.step("Still fixed.")
    assert (reward, terminated, info["success"], box.stopped) == (1.0, True, True, 1)
    assert "unreadable" not in info["failure_mode"]


def test_episodes_through_the_agent_native_manager(rock, play, scripted) -> None:
    spec = CustomEnvConfig(env_type="rock_tb_native_env", env_manager_cls=NATIVE, max_steps=5, env_config=rock)
    assert spec.step_timeout_s == 3000  # max_env_time, not the 60 s of other envs
    (result,) = play(spec, scripted([LS, "Done."]))
    assert (result.end_reason, result.num_turns, result.success) == ("terminated", 2, True)
    assert result.batch.batch["scores"].tolist() == [0.0, 1.0]
    assert FakeSandbox.made[0].commands == ["ls /testbed"] and FakeSandbox.made[0].stopped == 1


def test_a_start_failure_is_an_env_error_and_the_sandbox_is_stopped(rock, play, scripted) -> None:
    FakeSandbox.scenario = {"start_fails": True}
    spec = CustomEnvConfig(env_type="rock_tb_native_env", env_manager_cls=NATIVE, env_config=rock)
    (result,) = play(spec, scripted(["Done."]))
    assert result.end_reason == "env_error" and "image pull failed" in result.error
    assert FakeSandbox.made[0].stopped >= 1


def test_an_agent_that_sends_no_request_fails_the_reset(rock) -> None:
    FakeSandbox.scenario = {"no_first_request": True}
    env = make_env("rock_tb_native_env", **rock)
    with pytest.raises(RuntimeError, match="first LLM request did not come: model_service_anti_call_llm_failed"):
        env.reset(seed=0)
    assert FakeSandbox.made[0].stopped == 1 and env.sandbox is None


def test_a_hung_agent_times_out_and_the_sandbox_is_stopped(rock, play, scripted) -> None:
    spec = CustomEnvConfig(env_type="rock_tb_native_env", env_manager_cls=NATIVE, env_config=rock, step_timeout_s=0.5)
    FakeSandbox.scenario = {"hang": 2.0}
    (result,) = play(spec, scripted(["Done."]))
    assert result.end_reason == "env_timeout"
    deadline = time.monotonic() + 10
    while not FakeSandbox.made[0].stopped and time.monotonic() < deadline:  # closed on the runner's own thread
        time.sleep(0.05)
    assert FakeSandbox.made[0].stopped == 1


def test_config_errors_name_the_key(rock) -> None:
    with pytest.raises(ConfigError, match=r"env_config.sandbox_url: unknown field"):
        CustomEnvConfig(env_type="rock_tb_native_env", env_config={**rock, "sandbox_url": "http://x"})
    with pytest.raises(ConfigError, match=r"env_config.pass_low_threshold=0.5: .*never reads it"):
        CustomEnvConfig(env_type="rock_tb_native_env", env_config={**rock, "pass_low_threshold": 0.5})
    with pytest.raises(ConfigError, match=r"env_config.agent_config: .*agent_type is required"):
        CustomEnvConfig(env_type="rock_tb_native_env", env_config={**rock, "agent_config": {"run_cmd": "x"}})
    with pytest.raises(ConfigError, match=r"env_config.mode: Input should be 'train' or 'val'"):
        CustomEnvConfig(env_type="rock_tb_native_env", env_config={**rock, "mode": "test"})
    with pytest.raises(ConfigError, match=r"no task has an 'id' in env_config.val_idx_range"):
        make_env("rock_tb_native_env", **{**rock, "val_idx_range": [7, 9]})
    with pytest.raises(ConfigError, match=r"rock_tb_native_env: env_config.sandbox_url: unknown field"):
        make_env("rock_tb_native_env", **{**rock, "sandbox_url": "http://x"})  # the env built on its own


def test_validate_checks_warn_about_what_is_not_here(rock, tmp_path: Path) -> None:
    from roll.pipelines.data.sources import DataNotFoundError
    from roll.pipelines.validate import ServiceUnreachableError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {**rock, "dataset_name": str(tmp_path / "nope.jsonl"), "sandbox_base_url": f"http://127.0.0.1:{port}"}
    spec = CustomEnvConfig(env_type="rock_tb_native_env", env_manager_cls=NATIVE, env_config=config)
    checks = rock_checks({"SWE": spec, "other": CustomEnvConfig(env_type="sokoban")})
    assert len(checks) == 3  # agent config, tasks, service
    pytest.importorskip("rock.sdk.sandbox.agent.rock_agent")
    assert checks[0]() == "SWE: ROCK agent config accepted (agent_type 'default')"
    with pytest.raises(DataNotFoundError, match=r"custom_envs.SWE.env_config.dataset_name="):
        checks[1]()
    with pytest.raises(ServiceUnreachableError, match=f"ROCK service http://127.0.0.1:{port} does not answer"):
        checks[2]()


def test_without_the_sdk_the_error_gives_the_pip_command(rock, monkeypatch) -> None:
    import sys

    from roll.agentic.env.rock.config import RockEnvConfig
    from roll.agentic.env.rock.sandbox import RockSandbox

    monkeypatch.setitem(sys.modules, "rock.sdk.sandbox.client", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'roll-agentic\[rock\]'"):
        RockSandbox("img", RockEnvConfig.model_validate(rock))
