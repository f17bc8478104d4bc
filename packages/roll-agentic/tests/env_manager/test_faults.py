"""Env faults end the episode with a reason and no samples; the slot's env is rebuilt for the next episode."""

from __future__ import annotations

import threading

import pytest

from roll.agentic.config import CustomEnvConfig
from roll.agentic.env.base import check_reset_output, check_step_output


class FlakyEnv:
    """Misbehaves at the first step of its first episode (per instance), in the way named by ``mode``."""

    created = 0

    def __init__(self, mode: str) -> None:
        type(self).created += 1
        self.mode, self.episodes = mode, 0
        self.release = threading.Event()

    def reset(self, seed=None):
        self.episodes += 1
        if self.mode == "reset_raises":
            raise RuntimeError("the simulator crashed during reset")
        return "state 0", {}

    def step(self, action):
        if self.episodes == 1 and type(self).created == 1:
            if self.mode == "raises":
                raise ValueError("bad action handling")
            if self.mode == "exits":
                raise SystemExit(3)
            if self.mode == "hangs":
                self.release.wait(5)
            if self.mode == "garbage":
                return "state", 1.0, True  # three items instead of five
            if self.mode == "nan_reward":
                return "state", float("nan"), True, False, {}
            if self.mode == "not_text":
                return {"grid": [1, 2]}, 0.0, True, False, {}
        return "done", 1.0, True, False, {"success": True}


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("raises", "env_error"),
        ("exits", "env_error"),
        ("hangs", "env_timeout"),
        ("garbage", "env_malformed"),
        ("nan_reward", "env_malformed"),
        ("not_text", "env_malformed"),
    ],
)
def test_fault_ends_episode_and_env_is_rebuilt(play, scripted, mode, reason) -> None:
    FlakyEnv.created = 0
    spec = CustomEnvConfig(env_type=f"{__name__}:FlakyEnv", env_config={"mode": mode}, step_timeout_s=0.3)
    first, second = play(spec, scripted(["<answer>go</answer>"] * 4), episodes=2)
    assert (first.end_reason, first.faulted, first.batch, first.success) == (reason, True, None, False)
    assert first.error and first.num_turns == 1
    assert (second.end_reason, second.success, second.faulted) == ("terminated", True, False)
    assert second.batch is not None and FlakyEnv.created == 2


def test_reset_fault(play, scripted) -> None:
    spec = CustomEnvConfig(env_type=f"{__name__}:FlakyEnv", env_config={"mode": "reset_raises"})
    (result,) = play(spec, scripted(["x"]))
    assert (result.end_reason, result.num_turns, result.batch) == ("env_error", 0, None)
    assert "crashed during reset" in result.error


class CheckingAdapter:
    """Checks its inner env's output inside step() and reset(), as GemEnv and the tool wrapper do."""

    def __init__(self, mode: str) -> None:
        self.inner = FlakyEnv(mode)

    def reset(self, seed=None):
        return check_reset_output(self.inner.reset(seed))

    def step(self, action):
        return check_step_output(self.inner.step(action))


@pytest.mark.parametrize("mode", ["garbage", "nan_reward", "not_text"])
def test_malformed_output_caught_by_an_adapter_is_env_malformed(play, scripted, mode) -> None:
    FlakyEnv.created = 0
    spec = CustomEnvConfig(env_type=f"{__name__}:CheckingAdapter", env_config={"mode": mode})
    first, second = play(spec, scripted(["<answer>go</answer>"] * 4), episodes=2)
    assert (first.end_reason, first.faulted, first.batch) == ("env_malformed", True, None)
    assert first.error.startswith("step()") and "raised" not in first.error
    assert (second.end_reason, second.success) == ("terminated", True)
