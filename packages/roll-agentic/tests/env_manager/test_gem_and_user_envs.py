"""A GEM game and a user-written env class, each played for a few episodes through the managers."""

from __future__ import annotations

import asyncio
import random
import re

import numpy as np
import pytest

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env_manager import EnvRunner
from roll.agentic.policy import MockPolicyClient, ScriptedPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.strategies import GenerationConfig


class NumberLineEnv:
    """A user's env (no roll base class): reach ``target`` from 0 with <answer>+1</answer> / <answer>-1</answer>."""

    def __init__(self, span: int = 3) -> None:
        self.span, self.position, self.target = span, 0, 0

    def reset(self, seed=None):
        self.position, self.target = 0, 1 + (seed or 0) % self.span
        return f"position 0, target {self.target}", {"env_instruction": "Move along the number line."}

    def step(self, action):
        match = re.search(r"<answer>([+-]1)</answer>", action)
        if match is None:
            return f"position {self.position}", -0.1, False, False, {"action_is_valid": False, "success": False}
        self.position += int(match.group(1))
        done = self.position == self.target
        info = {"action_is_valid": True, "success": done}
        return f"position {self.position}, target {self.target}", float(done), done, False, info


def _binary_search(prompt: str) -> str:
    """Guess the Number by bisection over the hints in the conversation so far."""
    low, high = map(int, re.search(r"between (\d+) and (\d+)", prompt).groups())
    for guess, hint in re.findall(r"you guessed (\d+), and the target number is (higher|lower)", prompt):
        if hint == "higher":
            low = max(low, int(guess) + 1)
        else:
            high = min(high, int(guess) - 1)
    return f"My guess is \\boxed{{{(low + high) // 2}}}"


def _run(tokenizer, envs, tag, policy, manager="traj", groups=2, group_size=2):
    config = EnvManagerConfig(num_env_groups=groups, group_size=group_size, tags=[tag])
    client = MockPolicyClient(tokenizer, ScriptedPolicy(policy))
    scheduler = RolloutScheduler.local(
        config, envs, tokenizer, client, generation_config=GenerationConfig(max_new_tokens=48),
        sequence_length=4096, mode="val",
    )  # fmt: skip
    try:
        return scheduler.get_batch()
    finally:
        scheduler.close()


@pytest.mark.extra("gem")
@pytest.mark.parametrize("manager", ["traj", "step"])
def test_gem_guess_the_number(tokenizer, manager) -> None:
    pytest.importorskip("gem")
    env = CustomEnvConfig(
        env_type="game:GuessTheNumber-v0-easy",
        max_steps=6,
        env_manager_cls=manager,
        agent_template="{observation}" if manager == "traj" else "{env_instruction}\n{history}\n{current_observation}",
        history_length=10,
    )
    out = _run(tokenizer, {"guess": env}, "guess", _binary_search, manager)
    assert len(out.episodes) == 4
    assert all(e.success and e.end_reason == "terminated" for e in out.episodes), [
        (e.end_reason, e.num_turns) for e in out.episodes
    ]
    assert out.metrics["val/success"] == 1.0 and all(e.episode_score == 1.0 for e in out.episodes)
    # Members of a group share a seed, so they share the secret number and play identical games.
    by_group: dict[str, set[int]] = {}
    for e in out.episodes:
        by_group.setdefault(e.task.traj_group_id, set()).add(e.num_turns)
    assert all(len(turns) == 1 for turns in by_group.values())


def test_user_env_class_by_import_path(tokenizer) -> None:
    env = CustomEnvConfig(env_type=f"{__name__}:NumberLineEnv", env_config={"span": 3}, max_steps=5)
    out = _run(tokenizer, {"line": env}, "line", lambda prompt: "<answer>+1</answer>", groups=3)
    assert len(out.batch) == 6 and out.metrics["val/success"] == 1.0 and out.metrics["val/format"] == 1.0
    targets = [e.num_turns for e in out.episodes]
    assert set(targets) <= {1, 2, 3} and all(e.episode_score == 1.0 for e in out.episodes)
    wrong = _run(tokenizer, {"line": env}, "line", lambda prompt: "+1 please")
    assert wrong.metrics["val/success"] == 0.0 and wrong.metrics["val/format"] == 0.0
    assert all(e.end_reason == "max_steps" and abs(e.episode_score + 0.5) < 1e-9 for e in wrong.episodes)


class GlobalDiceEnv:
    """Seeds the process-global RNGs in reset and keeps drawing from them in step, as GEM's envs do."""

    uses_global_rng = True

    def reset(self, seed=None):
        random.seed(seed)
        np.random.seed(seed)
        return "rolled 0", {}

    def step(self, action):
        rolled = f"rolled {random.randint(1, 6)} and {int(np.random.randint(1, 7))}"
        return rolled, 0.0, False, False, {}


def test_envs_on_global_rngs_draw_as_if_each_ran_alone():
    """Two envs of one group (same seed, same actions) interleaved on one event loop: each call starts from the
    global RNG state its own env left, so both see the same rolls, and the rolls an env sees alone."""

    async def interleaved() -> tuple[list[str], list[str]]:
        lock = asyncio.Lock()
        first, second = (EnvRunner(GlobalDiceEnv, 10, lock=lock) for _ in range(2))
        await first.reset(3)
        await second.reset(3)
        seen: tuple[list[str], list[str]] = ([], [])
        for _ in range(4):
            for runner, rolls in zip((first, second), seen):
                rolls.append((await runner.step("roll"))[0])
                random.random()  # other code in the process draws too
        return seen

    async def alone() -> list[str]:
        runner = EnvRunner(GlobalDiceEnv, 10)
        await runner.reset(3)
        return [(await runner.step("roll"))[0] for _ in range(4)]

    first, second = asyncio.run(interleaved())
    assert first == second == asyncio.run(alone())
    assert len(set(first)) > 1
