"""ROLL's ``sokoban_mcp`` env against roll's Sokoban MCP server (``python -m roll.agentic.env.sokoban_mcp_server``,
started once for the module): the same rooms, rewards and ends as the local ``sokoban`` env, one game per env, and
clear errors when the server is down or is not a Sokoban server."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env import SokobanEnv, make_env
from roll.agentic.env.sokoban import read_room
from roll.agentic.env.sokoban_gen import solve
from roll.agentic.policy import MockPolicyClient, ScriptedPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.tools.base import ToolResult
from roll.runtime import ConfigError, MissingExtraError
from roll.strategies import GenerationConfig

pytestmark = pytest.mark.extra("mcp")


@pytest.fixture(autouse=True)
def _needs_mcp() -> None:
    pytest.importorskip("mcp")  # per test: a module skipped whole collects nothing, a failure under Pants


@pytest.fixture
def url(sokoban_mcp_server: str) -> str:
    return f"{sokoban_mcp_server}/sse"


@pytest.fixture
def env(url: str):
    env = make_env("sokoban_mcp", server_url=url, max_steps=50, format_penalty=-0.15)
    yield env
    env.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("path", ["/sse", "/mcp"])
def test_rooms_rewards_and_success_are_the_local_sokobans(sokoban_mcp_server: str, path: str) -> None:
    """Over SSE and over streamable HTTP: reset and each move of a solution give the local env's room text, reward,
    ends and success for the same seed."""
    env = make_env("sokoban_mcp", server_url=sokoban_mcp_server + path, max_steps=50)
    local = SokobanEnv(max_steps=50)
    try:
        for seed in (0, 7):
            room, info = env.reset(seed)
            local_room, local_info = local.reset(seed)
            assert room == local_room and info["env_instruction"] == local_info["env_instruction"]
            assert info["success"] is False
            moves = local.solution()
            assert moves
            for i, move in enumerate(moves):
                answer = f"<think>push</think><answer>{move}</answer><|im_end|>"
                obs, reward, terminated, truncated, info = env.step(answer)
                local_obs, local_reward, local_terminated, _, local_info = local.step(answer)
                assert (obs, reward, terminated) == (local_obs, pytest.approx(local_reward), local_terminated)
                assert not truncated and info["success"] is local_info["success"] is (i == len(moves) - 1)
                assert info["action_is_valid"] and info["metrics"]["action_is_valid"] == 1.0
            assert reward == pytest.approx(10.9) and info["metrics"]["success"] == 1.0  # -0.1 + 1 + 10, as ROLL's
            assert info["metrics_agg_mode"]["success"] == "last"
    finally:
        env.close()


def test_an_answer_that_does_not_parse_costs_the_format_penalty_and_calls_no_server(env) -> None:
    room, _ = env.reset(3)
    calls: list[str] = []
    call = env._tool.call
    env._tool.call = lambda name, arguments: calls.append(name) or call(name, arguments)
    for answer in ("Up", "<answer>Jump</answer>", "<answer></answer>"):
        obs, reward, terminated, truncated, info = env.step(answer)
        assert (obs, reward, terminated, truncated) == (room, -0.15, False, False)
        assert info["action_is_valid"] is False and info["metrics"]["format_penalty"] == -0.15
    assert calls == []
    env.step("<answer>down</answer>")  # case-insensitive, as ROLL's lookup
    assert calls == ["play"]


def test_two_envs_on_one_server_keep_their_own_games(url: str) -> None:
    first, second = (make_env("sokoban_mcp", server_url=url) for _ in range(2))
    local_first, local_second = SokobanEnv(), SokobanEnv()
    try:
        assert first.reset(1)[0] == local_first.reset(1)[0]
        assert second.reset(2)[0] == local_second.reset(2)[0]
        for move in ("Up", "Left", "Down", "Right", "Down"):
            for env, local in ((first, local_first), (second, local_second)):
                assert env.step(f"<answer>{move}</answer>")[:3] == local.step(f"<answer>{move}</answer>")[:3]
    finally:
        first.close()
        second.close()


def test_seeds_give_the_same_rooms_and_the_session_stays_open_across_episodes(env) -> None:
    rooms = [env.reset(seed)[0] for seed in (5, 6, 5)]
    session = env._tool
    assert rooms[0] == rooms[2] != rooms[1]
    env.step("<answer>Left</answer>")
    assert env.reset(5)[0] == rooms[0] and env._tool is session  # one MCP session for every episode
    env.close()
    assert env._tool is None and not session.connected
    env.close()  # twice is fine
    assert env.reset(6)[0] == rooms[1]  # a closed env opens a new session


def test_max_steps_truncates(url: str) -> None:
    env = make_env("sokoban_mcp", server_url=url, max_steps=2)
    try:
        env.reset(0)
        assert env.step("<answer>Up</answer>")[3] is False
        assert env.step("nonsense")[3] is True
    finally:
        env.close()


def test_a_failed_play_ends_the_episode_and_the_next_reset_reconnects(env) -> None:
    room, _ = env.reset(4)
    env._tool.call = lambda name, arguments: ToolResult(False, "the tool 'play' failed: ConnectError: gone")
    obs, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
    assert (obs, reward, terminated, truncated) == (room, 0.0, False, True)
    assert info["failure_mode"] == "tool_call_failed: play: the tool 'play' failed: ConnectError: gone"
    assert info["success"] is False and env._tool is None  # the session was dropped
    assert env.reset(4)[0] == room
    env._tool.call = lambda name, arguments: ToolResult(True, "<html>502</html>")
    _, reward, _, truncated, info = env.step("<answer>Up</answer>")
    assert truncated and reward == 0.0 and info["failure_mode"].startswith("bad_answer: its answer is not JSON")


def test_a_server_that_is_down_is_a_clear_error_naming_server_url() -> None:
    from roll.pipelines.validate import ServiceUnreachableError

    url = f"http://127.0.0.1:{_free_port()}/sse"
    env = make_env("sokoban_mcp", server_url=url)  # building connects to nothing
    started = time.monotonic()
    with pytest.raises(ServiceUnreachableError, match=rf"server_url '{url}' does not answer .*sokoban_mcp_server"):
        env.reset(0)
    assert time.monotonic() - started < 20
    env.close()


def test_a_server_that_is_not_sokoban_is_a_clear_error() -> None:
    calc = Path(__file__).parents[1] / "tools" / "mcp_calc_server.py"  # an MCP server with other tools
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(calc), "sse", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        env = make_env("sokoban_mcp", server_url=f"http://127.0.0.1:{port}/sse")
        with pytest.raises(ConfigError, match=r"is not a Sokoban MCP server \(.*has no tools \['play', 'reset'\]"):
            env.reset(0)
        env.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_validate_names_server_url_and_bad_settings(url: str) -> None:
    from roll.agentic.pool import check_env_spec
    from roll.pipelines.validate import ServiceUnreachableError

    with pytest.raises(ConfigError, match=r"custom_envs\.Box: sokoban_mcp needs env_config\.server_url"):
        check_env_spec("Box", CustomEnvConfig(env_type="sokoban_mcp", env_config={"max_steps": 5}))
    rolls_tokens = ["<think>", "</think>", "<answer>", "</answer>"]  # ROLL's default: no answer would ever parse
    with pytest.raises(ConfigError, match=r"removes '<answer>' .* drop it from special_token_list"):
        check_env_spec("Box", CustomEnvConfig(env_type="sokoban_mcp", env_config={"server_url": url, "special_token_list": rolls_tokens}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"action_lookup=.*must be the server's action ids"):
        make_env("sokoban_mcp", server_url=url, action_lookup={"up": "Up"})
    note = check_env_spec("Box", CustomEnvConfig(env_type="sokoban_mcp", env_config={"server_url": url}))
    assert note == f"Box: env_type 'sokoban_mcp' (SokobanMCPEnv); Sokoban MCP server {url} (sse)"
    down = f"http://127.0.0.1:{_free_port()}/mcp"
    with pytest.raises(ServiceUnreachableError, match=rf"server_url '{down}' does not answer"):
        check_env_spec("Box", CustomEnvConfig(env_type="sokoban_mcp", env_config={"server_url": down}))


def test_without_the_mcp_extra_it_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if the SDK were not installed
    with pytest.raises(MissingExtraError, match=r"sokoban_mcp env.*pip install 'roll-agentic\[mcp\]'"):
        make_env("sokoban_mcp", server_url="http://127.0.0.1:8000/sse")


def _solver(prompt: str) -> str:
    """The first move of a shortest solution from the last room in ``prompt`` (the step manager's prompt shows it in
    brackets: ``[######`` ... ``######]``)."""
    grid = re.findall(r"^\[?([#_OX√PS]{6})\]?$", prompt, re.MULTILINE)[-6:]
    room = read_room(grid)
    assert room is not None
    return f"<answer>{(solve(room) or ['Up'])[0]}</answer>"


@pytest.mark.parametrize("manager", ["traj", "step"])
def test_the_env_managers_play_it_to_the_end(tokenizer, url: str, manager: str) -> None:
    env = CustomEnvConfig(
        env_type="sokoban_mcp", env_config={"server_url": url}, max_steps=20, env_manager_cls=manager
    )  # fmt: skip
    config = EnvManagerConfig(num_env_groups=2, group_size=2, tags=["Box"])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(_solver))
    scheduler = RolloutScheduler.local(
        config, {"Box": env}, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=8192, mode="val",
    )  # fmt: skip
    try:
        out = scheduler.get_batch()
    finally:
        scheduler.close()
    assert len(out.episodes) == 4 and out.metrics["val/success"] == 1.0
    for episode in out.episodes:
        assert episode.end_reason == "terminated"
        # every move but the last costs 0.1; the last one also earns 1 + 10
        assert episode.episode_score == pytest.approx(11.0 - 0.1 * episode.num_turns)
