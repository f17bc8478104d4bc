"""sokoban_sandbox through its local stand-in: roll's real server and client in a temporary /app, ROLL's protocol
(two sessions, a server started in the background, a curl health check, the client's JSON), and its faults."""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path

import pytest

from roll.agentic.env import SokobanEnv, check_env, make_env
from roll.agentic.env.sokoban_sandbox import SandboxGameError, SokobanSandboxEnv
from roll.agentic.env.sokoban_sandbox.app import APP_FILES, write_app
from roll.agentic.env.sokoban_sandbox.app.__main__ import main as app_main
from roll.agentic.env.sokoban_sandbox.app.server import Game
from roll.agentic.env.sokoban_sandbox.local import LocalSandbox, live_processes
from roll.runtime import ConfigError, MissingExtraError

LOCAL = "roll.agentic.env.sokoban_sandbox.local:LocalSandbox"


def _env(**config) -> SokobanSandboxEnv:
    return make_env("sokoban_sandbox", **{"sandbox_cls": LOCAL, "server_start_timeout": 20, **config})  # type: ignore[return-value]


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


# --- the game of roll's app (in process) --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_the_apps_game_plays_as_sokoban_env(seed: int) -> None:
    game, env = Game(), SokobanEnv()
    game.reset(seed)
    room, _ = env.reset(seed)
    assert game.render() == room
    rng = random.Random(seed)
    replies = ["<answer>Up</answer>", "<answer>down</answer>", "Left", "<answer>Right</answer><|im_end|>", "<answer>x"]
    for _ in range(env.max_steps):
        reply = rng.choice(replies)
        answer = game.step(reply)
        obs, reward, terminated, truncated, info = env.step(reply)
        assert answer["info"]["suffix"] == f"Current map:\n{obs}"
        assert answer["reward"] == pytest.approx(reward)
        assert (answer["terminated"], answer["truncated"]) == (terminated, truncated)
        assert answer["info"]["action_is_valid"] == info["action_is_valid"]
        if terminated or truncated:
            break


# --- episodes through the stand-in ---------------------------------------------------------------------------------
def test_seeded_episodes_are_deterministic_and_rooms_are_sokoban_envs() -> None:
    first, second = _env(), _env()
    try:
        for seed in (3, 0):
            obs1, info1 = first.reset(seed=seed)
            obs2, info2 = second.reset(seed=seed)
            assert (obs1, info1) == (obs2, info2) and first.render() == second.render()
            assert first.render() == SokobanEnv().reset(seed)[0]
            assert info1["suffix"] == f"Current map:\n{first.render()}" and info1["success"] is False
            for reply in ("<answer>Left</answer>", "<answer>Up</answer>"):
                assert first.step(reply) == second.step(reply)
        assert first.reset(seed=4)[1]["suffix"] != first.reset(seed=5)[1]["suffix"]
        sandbox = first.sandbox
        assert isinstance(sandbox, LocalSandbox)
        # ROLL's protocol: the server started once in its own session, the client in the other
        assert sandbox.sessions == {"default", "server_session"}
        server = [c for s, c in sandbox.commands if s == "server_session"]
        assert server == ["cd /app && python server.py &"]
        client = [c for s, c in sandbox.commands if s == "default" and "client.py" in c]
        assert client[:2] == [
            "cd /app && python client.py reset --seed 3 --json",
            "cd /app && python client.py action '<answer>Left</answer>' --json",
        ]
    finally:
        first.close()
        second.close()


def test_a_solving_sequence_earns_the_success_reward_and_terminates() -> None:
    env = _env()
    try:
        env.reset(seed=11)
        reference = SokobanEnv()
        reference.reset(11)
        moves = reference.solution()
        assert moves
        total = 0.0
        for i, move in enumerate(moves):
            obs, reward, terminated, truncated, info = env.step(f"<answer>{move}</answer>")
            total += reward
            assert terminated == (i == len(moves) - 1) and not truncated
        assert info["success"] is True and info["metrics"]["success"] == 1.0
        assert reward == pytest.approx(-0.1 + 1.0 + 10.0)  # the last push puts the box on its target
        assert "solved" in obs and "X" not in env.render()
        with pytest.raises(RuntimeError, match="call reset"):
            env.step("<answer>Up</answer>")
    finally:
        env.close()


def test_roll_answers_are_read_as_rolls_sokoban_reads_them(tmp_path: Path) -> None:
    env, reference = _env(), SokobanEnv()
    marker = tmp_path / "pwned"
    try:
        env.reset(seed=2)
        reference.reset(2)
        for reply, valid in [
            ("<think>left is free</think>\n<answer>left</answer><|im_end|>", True),  # case, newline, chat token
            ("I'd go <answer> Down </answer>", True),  # a quote for the shell, spaces in the answer
            ("Up", False),
            ("<answer>jump</answer>", False),
            (f"$(touch {marker}) `touch {marker}` <answer>Up", False),  # shell text stays text
            ("<answer>Right</answer> then <answer>Up</answer>", True),  # the first answer counts
        ]:
            _, reward, _, _, info = env.step(reply)
            room, expected_reward, _, _, expected = reference.step(reply)
            assert (info["action_is_valid"], env.render(), reward) == (valid, room, pytest.approx(expected_reward))
            assert expected["action_is_valid"] is valid, reply
        assert not marker.exists()
    finally:
        env.close()


def test_close_stops_the_server_and_removes_the_sandbox() -> None:
    env = _env()
    env.reset(seed=1)
    sandbox = env.sandbox
    assert isinstance(sandbox, LocalSandbox) and sandbox.root is not None
    root, port, groups = sandbox.root, sandbox.server_port, set(sandbox.groups)
    assert live_processes(groups) and not _refuses_connections(port)
    env.close()
    env.close()  # twice is harmless
    assert live_processes(groups) == [] and _refuses_connections(port) and not root.exists()
    assert env.sandbox is None
    env.reset(seed=1)  # a new sandbox
    try:
        assert env.sandbox is not sandbox and env.render() == SokobanEnv().reset(1)[0]
    finally:
        env.close()


# --- faults --------------------------------------------------------------------------------------------------------
class SilentServer(LocalSandbox):
    """Its server starts but never listens."""

    def prepare_app(self, app: Path) -> None:
        write_app(app)
        (app / "server.py").write_text("import time\ntime.sleep(600)\n")


class GarbledClient(LocalSandbox):
    """Its client answers reset as the real one does, and each move with a traceback instead of JSON."""

    def prepare_app(self, app: Path) -> None:
        write_app(app)
        (app / "client.py").rename(app / "real_client.py")
        (app / "client.py").write_text(
            "import sys\nimport real_client\n"
            "if sys.argv[1] == 'reset':\n    sys.exit(real_client.main())\n"
            "print('Traceback (most recent call last):\\n  boom')\n"
        )


class GarbledReset(LocalSandbox):
    def prepare_app(self, app: Path) -> None:
        write_app(app)
        (app / "client.py").write_text("print('not json')\n")


class FailingStart(LocalSandbox):
    made: list[FailingStart] = []

    def start(self) -> None:
        FailingStart.made.append(self)
        super().start()
        raise RuntimeError("image pull failed")

    def stop(self) -> None:
        self.stopped = True
        super().stop()


class NeverAlive(LocalSandbox):
    def is_alive(self) -> bool:
        return False


def test_a_server_that_never_answers_fails_the_reset_within_its_timeout_and_leaves_nothing_running() -> None:
    made: list[LocalSandbox] = []

    class Kept(SilentServer):
        def start(self) -> None:
            made.append(self)
            super().start()

    env = make_env("sokoban_sandbox", sandbox_cls=Kept, server_start_timeout=1.5)
    with pytest.raises(SandboxGameError, match=r"did not answer on port \d+ within server_start_timeout=1.5 s"):
        env.reset(seed=0)
    assert env.sandbox is None  # stopped: no sandbox, none of its processes, no files
    assert made and made[0].groups and live_processes(made[0].groups) == [] and made[0].root is None


def test_a_step_answered_with_something_else_than_json_ends_the_episode_with_the_reason() -> None:
    env = make_env("sokoban_sandbox", sandbox_cls=GarbledClient, server_start_timeout=20)
    try:
        env.reset(seed=3)
        room = env.render()
        obs, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["error"] == "JSONDecodeError" and "boom" in info["raw_output"]
        assert info["failure_mode"].startswith("bad_answer: its output is not JSON")
        assert obs.startswith("Error:") and env.render() == room
        with pytest.raises(RuntimeError, match="call reset"):
            env.step("<answer>Up</answer>")
        sandbox = env.sandbox
        env.reset(seed=3)  # the sandbox plays on
        assert env.sandbox is sandbox and env.render() == room
    finally:
        env.close()


def test_a_reset_answered_with_something_else_than_json_raises_and_stops_the_sandbox() -> None:
    env = make_env("sokoban_sandbox", sandbox_cls=GarbledReset, server_start_timeout=20)
    with pytest.raises(SandboxGameError, match="its output is not JSON: 'not json'"):
        env.reset(seed=0)
    assert env.sandbox is None


def test_a_sandbox_that_fails_to_start_fails_the_reset_and_is_stopped() -> None:
    FailingStart.made.clear()
    env = make_env("sokoban_sandbox", sandbox_cls=FailingStart)
    for _ in range(2):  # each reset tries a new sandbox
        with pytest.raises(SandboxGameError, match="did not start: RuntimeError: image pull failed"):
            env.reset(seed=0)
    assert len(FailingStart.made) == 2 and all(box.stopped and box.root is None for box in FailingStart.made)


def test_a_sandbox_never_alive_fails_within_alive_timeout() -> None:
    env = make_env("sokoban_sandbox", sandbox_cls=NeverAlive, alive_timeout=0.5)
    with pytest.raises(SandboxGameError, match="not alive within alive_timeout=0.5 s"):
        env.reset(seed=0)
    assert env.sandbox is None


def test_a_step_whose_command_fails_ends_the_episode_and_the_next_reset_starts_a_new_sandbox() -> None:
    env = _env(command_timeout=5)
    try:
        env.reset(seed=1)
        sandbox = env.sandbox
        assert isinstance(sandbox, LocalSandbox)
        sandbox.sessions.clear()  # the service forgot the session
        _, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert (
            info["failure_mode"].startswith("command_failed in sandbox local-") and "no session" in info["raw_output"]
        )
        assert env.sandbox is None and sandbox.root is None
        env.reset(seed=1)
        assert env.sandbox is not None and env.sandbox is not sandbox
    finally:
        env.close()


# --- settings and the app's files ----------------------------------------------------------------------------------
def test_settings_are_checked_with_the_accepted_keys_named() -> None:
    with pytest.raises(ConfigError, match=r"accepted keys: \['base_url', 'server_start_timeout', 'image'"):
        make_env("sokoban_sandbox", base_url="http://x", server_port=8001)
    with pytest.raises(ConfigError, match="server_start_timeout"):
        SokobanSandboxEnv(server_start_timeout=0)
    with pytest.raises(ConfigError, match=r"accepted keys: \[.*'sandbox_cls'\]"):
        SokobanSandboxEnv(bogus=1)
    assert (
        check_env("sokoban_sandbox", {"base_url": "http://rock:8080", "server_start_timeout": 30}) is SokobanSandboxEnv
    )


def test_a_config_entry_with_bad_settings_fails_at_load_naming_the_key() -> None:
    """Checked when the config loads (inside the entry's own validation), not at the first episode's build."""
    from roll.agentic.config import CustomEnvConfig

    with pytest.raises(ConfigError, match=r"sokoban_sandbox: env_config.bogus: unknown field.*accepted keys: \["):
        CustomEnvConfig.model_validate({"env_type": "sokoban_sandbox", "env_config": {"bogus": 1}})
    with pytest.raises(ConfigError, match=r"env_config.server_start_timeout: Input should be greater than 0"):
        CustomEnvConfig.model_validate({"env_type": "sokoban_sandbox", "env_config": {"server_start_timeout": -1}})


def test_server_args_reach_the_server() -> None:
    env = _env(server_args="--dim-room 5 7 --max-steps 2")
    try:
        env.reset(seed=9)
        assert env.render() == SokobanEnv(dim_room=(5, 7)).reset(9)[0]
        env.step("no answer")
        assert env.step("no answer")[3] is True  # truncated at the server's 2 moves
    finally:
        env.close()


def test_write_app_gives_the_images_files(tmp_path: Path, capsys) -> None:
    app_main(["--write-app", str(tmp_path / "app"), "--dockerfile"])
    assert sorted(str(p.relative_to(tmp_path / "app")) for p in (tmp_path / "app").rglob("*.py")) == sorted(APP_FILES)
    dockerfile = capsys.readouterr().out
    assert "COPY . /app" in dockerfile and "curl" in dockerfile
    for name, source in APP_FILES.items():
        assert (tmp_path / "app" / name).read_bytes() == source.read_bytes()


def test_an_entry_gets_a_step_timeout_that_covers_the_sandbox_start() -> None:
    from roll.agentic.config import CustomEnvConfig

    default = CustomEnvConfig.model_validate({"env_type": "sokoban_sandbox"})
    assert default.step_timeout_s == 360 + 180 + 60 + 3 * 60
    quick = {"startup_timeout": 10, "alive_timeout": 5, "server_start_timeout": 5, "command_timeout": 2}
    assert CustomEnvConfig.model_validate({"env_type": "sokoban_sandbox", "env_config": quick}).step_timeout_s == 26
    own = {"env_type": "sokoban_sandbox", "step_timeout_s": 30}
    assert CustomEnvConfig.model_validate(own).step_timeout_s == 30


def _silent_url() -> str:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_roll_validate_names_the_stand_in_or_without_rocks_sdk_the_pip_command(monkeypatch) -> None:
    assert SokobanSandboxEnv.check_args(sandbox_cls=LOCAL) == f"sandbox_cls {LOCAL}"
    monkeypatch.setitem(sys.modules, "rock.sdk.sandbox.client", None)  # as if rl-rock were not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'roll-agentic\[rock\]'"):
        SokobanSandboxEnv.check_args(base_url=_silent_url())


def test_roll_validate_checks_the_rock_service() -> None:
    pytest.importorskip("rock.sdk.sandbox.client")
    from roll.pipelines.validate import ServiceUnreachableError

    url = _silent_url()
    with pytest.raises(ServiceUnreachableError, match=f"ROCK service {url} does not answer.*env_config.base_url"):
        SokobanSandboxEnv.check_args(base_url=url)


def test_without_rocks_sdk_the_env_names_the_pip_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "rock.sdk.sandbox.client", None)  # as if rl-rock were not installed
    with pytest.raises(MissingExtraError, match=r"sokoban_sandbox.*pip install 'roll-agentic\[rock\]'"):
        make_env("sokoban_sandbox", base_url="http://rock:8080")
    assert isinstance(_env().sandbox_cls, type)  # the stand-in needs no SDK
