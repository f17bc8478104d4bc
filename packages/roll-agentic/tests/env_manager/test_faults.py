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


class _SlowBuildEnv:
    """A slow build beside a ``releaser`` env: the slow build (see the subclasses) waits until ``released``; the
    releaser's first step waits until that build has ``started``, its second releases it. ``saw_release``: whether
    the build saw the release (so the releaser's second step ran while the build was under way)."""

    built = 0
    started: threading.Event
    released: threading.Event
    saw_release: bool | None = None

    def __init__(self, role: str) -> None:
        self.role, self.steps = role, 0

    @classmethod
    def reset_record(cls) -> None:
        cls.built, cls.saw_release = 0, None
        cls.started, cls.released = threading.Event(), threading.Event()

    def build_slowly(self) -> None:
        type(self).started.set()
        type(self).saw_release = type(self).released.wait(5)

    def reset(self, seed=None):
        return "state", {}

    def step(self, action):
        self.steps += 1
        if self.role == "releaser" and self.steps == 1:
            type(self).started.wait(5)
            return "state", 0.0, False, False, {}
        if self.role == "releaser":
            type(self).released.set()
        return "done", 1.0, True, False, {"success": True}


def _pool_beside_a_releaser(env_cls: type[_SlowBuildEnv], role: str, tokenizer, scripted, slots: list[str]):
    """A pool of ``env_cls`` envs, tags ``role`` and ``releaser``, with the slots of ``slots`` (env ids 0 and 1)."""
    from roll.agentic.pool import EnvPool, EnvSlot
    from roll.strategies import GenerationConfig

    env_cls.reset_record()
    specs = {
        tag: CustomEnvConfig(env_type=f"{__name__}:{env_cls.__name__}", env_config={"role": tag}, step_timeout_s=10)
        for tag in (role, "releaser")
    }
    client = scripted(lambda prompt: "<answer>go</answer>")
    pool = EnvPool(specs, tokenizer, client, generation_config=GenerationConfig(), sequence_length=4096)
    pool.add_slots([EnvSlot((role, "releaser").index(tag), (role, "releaser").index(tag), tag) for tag in slots])
    return pool


class SlowRebuildEnv(_SlowBuildEnv):
    """``flaky``: the first instance raises at its first step; the second (the rebuild) builds slowly."""

    def __init__(self, role: str) -> None:
        super().__init__(role)
        if role == "flaky":
            type(self).built += 1
            if type(self).built == 2:
                self.build_slowly()

    def step(self, action):
        if self.role == "flaky" and type(self).built == 1:
            raise RuntimeError("crash")
        return super().step(action)


def test_a_slow_rebuild_holds_up_no_other_env(tokenizer, scripted) -> None:
    import asyncio

    from roll.agentic.env_manager import EpisodeTask

    pool = _pool_beside_a_releaser(SlowRebuildEnv, "flaky", tokenizer, scripted, ["flaky", "releaser"])

    async def flaky() -> list[str]:
        reasons = []
        for i in range(2):
            reasons.append((await pool.run_episode(EpisodeTask(0, 0, "flaky", i, i, f"f{i}", f"f{i}_0"))).end_reason)
        return reasons

    async def main():
        return await asyncio.gather(flaky(), pool.run_episode(EpisodeTask(1, 1, "releaser", 0, 0, "r", "r_0")))

    try:
        reasons, other = asyncio.run(main())
    finally:
        pool.close()
    # the other env's second step (sent from the event loop) ran while the rebuild was under way
    assert SlowRebuildEnv.saw_release is True
    assert reasons == ["env_error", "terminated"] and (other.end_reason, other.num_turns) == ("terminated", 2)


class HangingRebuildEnv:
    """The first instance raises at its first step; the second takes 1 s to build (past the timeout); the third is
    fine."""

    built = 0

    def __init__(self) -> None:
        type(self).built += 1
        self.number = type(self).built
        if self.number == 2:
            threading.Event().wait(1)

    def reset(self, seed=None):
        return "state", {}

    def step(self, action):
        if self.number == 1:
            raise RuntimeError("crash")
        return "done", 1.0, True, False, {"success": True}


def test_a_rebuild_past_the_timeout_ends_that_episode_only(play, scripted) -> None:
    HangingRebuildEnv.built = 0
    spec = CustomEnvConfig(env_type=f"{__name__}:HangingRebuildEnv", step_timeout_s=0.3)
    results = play(spec, scripted(["<answer>go</answer>"] * 4), episodes=3)
    assert [r.end_reason for r in results] == ["env_error", "env_timeout", "terminated"]
    assert "rebuilding the env did not finish within 0.3 s" in results[1].error


class MovedSlotEnv(_SlowBuildEnv):
    """``moved``: the first build raises (a service of the new worker's node is down), the second builds slowly."""

    def __init__(self, role: str) -> None:
        super().__init__(role)
        if role == "moved":
            type(self).built += 1
            if type(self).built == 1:
                raise ConnectionError("the sandbox service did not answer")
            self.build_slowly()


def test_a_slot_moved_here_is_built_off_the_loop_and_a_failed_build_is_a_fault(tokenizer, scripted) -> None:
    import asyncio

    from roll.agentic.env_manager import EpisodeTask

    # slot 0 lives on a worker that dies: its episodes come here
    pool = _pool_beside_a_releaser(MovedSlotEnv, "moved", tokenizer, scripted, ["releaser"])

    async def moved() -> list:
        return [await pool.run_episode(EpisodeTask(0, 0, "moved", i, i, f"m{i}", f"m{i}_0")) for i in range(2)]

    async def main():
        return await asyncio.gather(moved(), pool.run_episode(EpisodeTask(1, 1, "releaser", 0, 0, "r", "r_0")))

    try:
        (faulted, played), other = asyncio.run(main())
    finally:
        pool.close()
    reasons = [faulted.end_reason, played.end_reason]
    # the failed build ended that episode only; the other env's second step ran while the second build was under way
    assert reasons == ["env_error", "terminated"] and MovedSlotEnv.saw_release is True
    assert faulted.metrics == {"success": 0.0, "num_turns": 0.0, "episode_score": 0.0, "generated_tokens": 0.0}
    assert (other.end_reason, other.num_turns) == ("terminated", 2)


class SlowCloseEnv:
    """close() takes 0.3 s (a remote sandbox being stopped) and records that it finished."""

    closed: list[int] = []

    def __init__(self, number: int = 0) -> None:
        self.number = number

    def reset(self, seed=None):
        return "state", {}

    def step(self, action):
        return "done", 1.0, True, False, {}

    def close(self) -> None:
        threading.Event().wait(0.3)
        type(self).closed.append(self.number)


def test_closing_the_pool_waits_for_its_envs_to_close(tokenizer, scripted) -> None:
    from roll.agentic.pool import EnvPool, EnvSlot
    from roll.strategies import GenerationConfig

    SlowCloseEnv.closed = []
    specs = {f"T{i}": CustomEnvConfig(env_type=f"{__name__}:SlowCloseEnv", env_config={"number": i}) for i in range(3)}
    pool = EnvPool(specs, tokenizer, scripted(["x"]), generation_config=GenerationConfig(), sequence_length=4096)
    pool.add_slots([EnvSlot(i, i, f"T{i}") for i in range(3)])
    pool.close()  # the worker's process may end right after: no close may be cut short
    assert sorted(SlowCloseEnv.closed) == [0, 1, 2]


class ExitingRebuildEnv(HangingRebuildEnv):
    """As HangingRebuildEnv, but the rebuild calls sys.exit() instead of hanging."""

    def __init__(self) -> None:
        type(self).built += 1
        self.number = type(self).built
        if self.number == 2:
            raise SystemExit(2)


def test_a_rebuild_that_exits_is_an_env_error(play, scripted) -> None:
    ExitingRebuildEnv.built = 0
    spec = CustomEnvConfig(env_type=f"{__name__}:ExitingRebuildEnv")
    results = play(spec, scripted(["<answer>go</answer>"] * 4), episodes=3)
    assert [r.end_reason for r in results] == ["env_error", "env_error", "terminated"]
    assert "rebuilding the env failed: SystemExit" in results[1].error
