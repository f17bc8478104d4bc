"""atropos_env: tiny Atropos envs written here (no dataset, no hub) played through roll's env contract."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.env import check_env, make_env
from roll.agentic.env.atropos import AtroposRewardConfig, episode_reward, first_score
from roll.runtime import ConfigError, MissingExtraError

pytestmark = pytest.mark.extra("atropos")
pytest.importorskip("atroposlib")

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup  # noqa: E402
from atroposlib.envs.server_handling.server_baseline import ServerBaseline  # noqa: E402

# In this module's namespace too: the tests name it as f"{__name__}:TinyArithmeticEnv".
from roll.agentic.env.atropos.testing import QUESTIONS, SYSTEM, TinyArithmeticEnv  # noqa: E402


class TinyRandomEnv(TinyArithmeticEnv):
    """Draws its item with Python's random, as many Atropos envs do."""

    async def get_next_item(self) -> tuple[str, str]:
        return random.choice(QUESTIONS)


class TinyEchoEnv(BaseEnv):
    """Two turns through the plain chat endpoint: say a number, then say it again; 1.0 when both match, no score
    (None) when they do not; ``tools`` passed as an agent env would."""

    name = "tiny_echo"
    TOOLS = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline]:
        return BaseEnvConfig(group_size=1, use_wandb=False), ServerBaseline()

    async def setup(self) -> None:
        return None

    async def get_next_item(self) -> str:
        return "Say a number."

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def collect_trajectories(self, item: str) -> tuple[ScoredDataGroup | None, list[Any]]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": item}]
        first = await self.server.chat_completion(messages=messages, n=1, tools=self.TOOLS)
        said = first.choices[0].message.content
        messages += [{"role": "assistant", "content": said}, {"role": "user", "content": f"You said {said}. Again."}]
        try:
            second = await self.server.chat_completion(messages=messages, n=1, tools=self.TOOLS)
        except Exception:  # an env that swallows its own errors must not swallow the turn boundary
            return None, []
        again = second.choices[0].message.content
        return (ScoredDataGroup(tokens=[[1]], masks=[[1]], scores=[1.0]) if again == said else None), []


class TinyDrawingEnv(TinyArithmeticEnv):
    """Draws the number it asks for inside collect_trajectories, as envs that shuffle options do."""

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        number = str(random.randrange(10**9))
        messages = [{"role": "user", "content": f"Repeat {number}."}]
        completion = await self.server.chat_completion(messages=messages, n=1)
        said = completion.choices[0].message.content
        return ScoredDataGroup(tokens=[[1]], masks=[[1]], scores=[1.0 if said == number else -1.0]), []


class NotAnAtroposEnv:
    pass


@pytest.fixture(scope="module")
def tokenizer_dir(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("atropos_tokenizer")
    tokenizer.save_pretrained(folder)
    return str(folder)


def _env(tokenizer_dir: str, cls: str = "TinyArithmeticEnv", **overrides: Any) -> Any:
    env_config = {"tokenizer_name": tokenizer_dir, **overrides.pop("env_config", {})}
    return make_env("atropos_env", atropos_env_path=f"{__name__}:{cls}", env_config=env_config, **overrides)


def test_reset_asks_the_envs_own_prompt_and_a_right_answer_earns_its_score(tokenizer_dir: str) -> None:
    env = _env(tokenizer_dir)
    observation, info = env.reset(seed=0)
    assert observation == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2 + 3?"}]
    assert info == {"tools": [], "success": False}
    response = "<think>2 plus 3</think> The answer is \\boxed{5}"
    observation, reward, terminated, truncated, info = env.step(response)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info == {"success": True, "atropos_score": 1.0, "metrics": {"atropos_scored": 1.0}}
    # the response reached the env as written (ids of the env's tokenizer, decoded by Atropos's managed server)
    assert env.env.last_text == response
    assert observation[-1] == {"role": "assistant", "content": response}
    assert env.env.config.group_size == 1  # its config_init says 4: roll samples one response per episode
    env.close()


def test_a_wrong_answer_earns_rolls_shaped_reward_with_the_reward_config(tokenizer_dir: str) -> None:
    markers = [{"marker": "\\boxed{", "reward": 0.3}, {"marker": "<think>", "reward": 0.2}]
    env = _env(tokenizer_dir, reward_config={"format_markers": markers, "length_bounty_max": 0.01})
    env.reset(seed=0)
    response = "<think>hm</think> \\boxed{6}"  # wrong: the env scores -1.0
    _, reward, terminated, _, info = env.step(response)
    assert reward == pytest.approx(-1.0 + 0.3 + 0.2 + 0.01) and terminated
    assert info["atropos_score"] == -1.0 and info["success"] is False
    env.reset(seed=1)  # the env's next item, in its own order
    _, reward, _, _, _ = env.step("x" * 5)  # no marker, 5 characters: -1 + 0.005
    assert reward == pytest.approx(-0.995)
    assert env.messages[1]["content"] == "What is 4 * 4?"


def test_an_env_that_draws_at_random_draws_by_seed(tokenizer_dir: str) -> None:
    first, second = _env(tokenizer_dir, "TinyRandomEnv"), _env(tokenizer_dir, "TinyRandomEnv")
    asked = [first.reset(seed=s)[0][1]["content"] for s in range(12)]
    assert asked == [second.reset(seed=s)[0][1]["content"] for s in range(12)]  # one seed, one item: a GRPO group
    assert len(set(asked)) == len(QUESTIONS)


def test_turns_replay_every_earlier_response_and_the_boundary_survives_except_exception(tokenizer_dir: str) -> None:
    env = _env(tokenizer_dir, "TinyEchoEnv", max_steps=4)
    observation, info = env.reset(seed=3)
    assert observation == [{"role": "user", "content": "Say a number."}] and info["tools"] == TinyEchoEnv.TOOLS
    observation, reward, terminated, truncated, info = env.step("7")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert observation[1:] == [{"role": "assistant", "content": "7"}, {"role": "user", "content": "You said 7. Again."}]
    _, reward, terminated, _, info = env.step("7")
    assert (reward, terminated, info["atropos_score"]) == (1.0, True, 1.0)
    # no score (None) from the env: the shaped reward of the last response, and atropos_scored 0
    env.reset()
    env.step("7")
    _, reward, terminated, _, info = env.step("8")
    assert reward == pytest.approx(-1.0 + 0.001) and info["metrics"] == {"atropos_scored": 0.0}


def test_the_turn_that_reaches_max_steps_is_truncated(tokenizer_dir: str) -> None:
    env = _env(tokenizer_dir, "TinyEchoEnv", max_steps=1)
    env.reset()
    _, reward, terminated, truncated, _ = env.step("3")
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_the_runner_hands_the_messages_on_as_json(tokenizer_dir: str) -> None:
    import asyncio

    from roll.agentic.env_manager.runner import EnvRunner

    runner = EnvRunner(lambda: _env(tokenizer_dir), 30.0, messages=True)
    observation, _ = asyncio.run(runner.reset(0))
    assert json.loads(observation)[1] == {"role": "user", "content": "What is 2 + 3?"}
    runner.close()


def test_check_env_reads_rolls_keys_and_names_what_is_wrong(tokenizer_dir: str) -> None:
    path = f"{__name__}:TinyArithmeticEnv"
    factory = check_env("atropos_env", {"atropos_env_path": path, "max_steps": 1, "debug": True})
    assert factory.check_args(atropos_env_path=path, env_config={"max_token_length": 8}) == (
        "Atropos env TinyArithmeticEnv"
    )
    with pytest.raises(ConfigError, match=r"does not fit .*accepted keys: \['atropos_env_path', 'max_steps'"):
        check_env("atropos_env", {"atropos_env_path": path, "max_step": 1})
    with pytest.raises(ConfigError, match=r"keys \['max_tokens'\] are not settings of TinyArithmeticEnv's config"):
        factory.check_args(atropos_env_path=path, env_config={"max_tokens": 8})
    with pytest.raises(ConfigError, match=r"group_size=8: roll samples one response per episode"):
        factory.check_args(atropos_env_path=path, env_config={"group_size": 8})
    with pytest.raises(
        ConfigError, match=r"^env_config\.env_config\.max_token_length: Input should be a valid integer"
    ):
        factory.check_args(atropos_env_path=path, env_config={"max_token_length": "many"})
    with pytest.raises(ConfigError, match=r"reward_config: (?s:.*)length_bounty: unknown field"):
        factory.check_args(atropos_env_path=path, reward_config={"length_bounty": 0.1})


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests_missing_module:Env", r"atropos_env_path='tests_missing_module:Env' cannot be imported"),
        ("environments.gsm8k_server:GSM8kEnv", r"not part of the atroposlib package: put a checkout"),
        (f"{__name__}:NotAnAtroposEnv", r"not a subclass of atroposlib.envs.base.BaseEnv"),
        (f"{__name__}.TinyArithmeticEnv", r"must name the Atropos env class as 'module:Class'"),
        (f"{__name__}:Missing", r"cannot be imported \(AttributeError"),
    ],
)
def test_a_bad_atropos_env_path_is_a_config_error(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_env("atropos_env", atropos_env_path=path)


def test_a_tokenizer_that_does_not_load_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer '.*nowhere' does not load .*env_config.tokenizer_name"):
        _env(str(tmp_path / "nowhere"))


def test_without_atroposlib_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "atroposlib", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'roll-agentic\[atropos\]'"):
        make_env("atropos_env", atropos_env_path=f"{__name__}:TinyArithmeticEnv")


def test_score_and_reward_helpers() -> None:
    assert first_score(None) is None and first_score({"scores": []}) is None
    assert first_score([None, {"scores": [0.5, 1.0]}]) == 0.5
    config = AtroposRewardConfig()  # ROLL's defaults: <think> 0.2, \boxed{ 0.3, length up to 0.2
    assert episode_reward(0.7, "", config) == 0.7
    assert episode_reward(0.0, "<think>a</think>\\boxed{1}", config) == pytest.approx(-1 + 0.5 + 0.025)  # 25 characters
    assert episode_reward(None, "y" * 5000, config) == pytest.approx(-0.8)


def test_a_later_turn_is_graded_against_the_prompt_the_model_was_shown(tokenizer_dir: str) -> None:
    env = _env(tokenizer_dir, "TinyDrawingEnv")
    for seed in (0, None):
        observation, _ = env.reset(seed=seed)
        number = observation[-1]["content"].removeprefix("Repeat ").removesuffix(".")
        _, reward, terminated, _, info = env.step(number)
        assert (reward, terminated, info["atropos_score"]) == (1.0, True, 1.0)
