"""GEM envs by id: settings GEM's env classes would silently drop, and ids that are close to a real one."""

from __future__ import annotations

import pytest

from roll.agentic.env import check_env, make_env
from roll.runtime import ConfigError

pytestmark = pytest.mark.extra("gem")


def test_a_misspelled_gem_setting_is_an_error_not_ignored() -> None:
    pytest.importorskip("gem")
    # GuessTheNumberEnv takes **_ and would play with its default max_turns
    with pytest.raises(ConfigError, match=r"keys \['max_turn'\] are not settings of GEM env .*'max_turns'"):
        make_env("game:GuessTheNumber-v0-easy", max_turn=3)
    with pytest.raises(ConfigError, match=r"keys \['max_turn'\]"):
        check_env("gem:game:GuessTheNumber-v0-easy", {"max_turn": 3})
    env = make_env("game:GuessTheNumber-v0-easy", max_turns=3, success_reward=1.0)
    assert "within 3 turns" in env.reset(seed=0)[0]


def test_an_almost_right_gem_id_names_the_real_ones() -> None:
    pytest.importorskip("gem")
    with pytest.raises(ConfigError, match=r"unknown GEM env id 'game:GuessTheNumber-v1'; did you mean .*-v0-easy"):
        make_env("gem:game:GuessTheNumber-v1")
    with pytest.raises(ConfigError, match=r"unknown env_type 'game:GuessTheNumber-v1'.*GEM ids like it: .*-v0-easy"):
        make_env("game:GuessTheNumber-v1")


def test_gem_ids_from_before_gem_llm_0_1_play_with_their_old_settings() -> None:
    gem = pytest.importorskip("gem")
    from gem.envs.registration import ENV_REGISTRY

    from roll.agentic.env.gem import LEGACY_GEM_IDS, gem_env_ids

    # ROLL's qwen3_agentic_gem/gem_game_guess_the_number.yaml names game:GuessTheNumber-v0, which gem-llm 0.1 split
    # into -easy/-hard/-random variants
    env = make_env("game:GuessTheNumber-v0")
    assert "between 1 and 20 (inclusive) within 10 turns" in env.reset(seed=0)[0]
    # the ROLL file's env_config overrides the old settings, and a misspelled key is still refused
    env = make_env("game:GuessTheNumber-v0", min_number=1, max_number=20, max_turns=20)
    assert "between 1 and 20 (inclusive) within 20 turns" in env.reset(seed=0)[0]
    with pytest.raises(ConfigError, match=r"keys \['max_turn'\] are not settings of GEM env 'game:GuessTheNumber-v0'"):
        make_env("gem:game:GuessTheNumber-v0", max_turn=3)
    # every old id is known, as gem-llm 0.0.4 registered it (gem-llm 0.1 has none of them), and builds its game
    assert set(LEGACY_GEM_IDS) <= set(gem_env_ids())
    for env_id, (entry_point, settings) in LEGACY_GEM_IDS.items():
        assert (ENV_REGISTRY[env_id].entry_point, ENV_REGISTRY[env_id].kwargs) == (entry_point, settings)
        if env_id not in ("game:Wordle-v0", "game:Hangman-v0"):  # these need nltk's word list, a download
            assert isinstance(gem.make(env_id).reset(seed=0)[0], str)


def test_gem_random_actions_follow_the_turns_seed_and_leave_the_episodes_draws_alone() -> None:
    pytest.importorskip("gem")
    import random

    import numpy as np

    env = make_env("game:GuessTheNumber-v0-hard")
    env.reset(seed=0)
    state = random.getstate(), np.random.get_state()[1].tolist()
    draws = [env.sample_random_action(seed=s) for s in range(20)]
    assert (random.getstate(), np.random.get_state()[1].tolist()) == state
    again = make_env("game:GuessTheNumber-v0-hard")
    again.reset(seed=1)
    assert draws == [again.sample_random_action(seed=s) for s in range(20)] and len(set(draws)) > 5


def test_without_gem_the_error_gives_the_pip_command(monkeypatch) -> None:
    import sys

    from roll.agentic.env.gem import import_gem
    from roll.runtime import MissingExtraError

    monkeypatch.setitem(sys.modules, "gem", None)
    with pytest.raises(MissingExtraError) as caught:
        import_gem()
    assert str(caught.value).startswith("a GEM environment needs an optional dependency that is not installed (")
    assert str(caught.value).endswith("Install it with: pip install 'roll-agentic[gem]'")


class OneAnswerEnv:
    """A single-turn env as GEM writes them (math, qa, code, reasoning-gym): every answer ends the episode terminated
    *and* truncated; ``correct`` in info only where ``says_correct``."""

    def __init__(self, says_correct: bool = True) -> None:
        self.says_correct = says_correct

    def reset(self, seed=None):
        return "What is 2 + 2?", {}

    def step(self, action):
        right = action == "\\boxed{4}"
        return "", 1.0 if right else 0.0, True, True, ({"correct": right} if self.says_correct else {})


@pytest.mark.parametrize("says_correct", [True, False])
def test_a_right_answer_to_a_single_turn_gem_env_is_a_success(says_correct) -> None:
    pytest.importorskip("gem")
    from gem.envs.registration import ENV_REGISTRY, register

    env_id = f"test:OneAnswer-v0-{says_correct}"
    if env_id not in ENV_REGISTRY:
        register(env_id, f"{__name__}:OneAnswerEnv", says_correct=says_correct)
    env = make_env(env_id)
    for answer, success in (("\\boxed{4}", True), ("\\boxed{5}", False)):
        env.reset(seed=0)
        assert env.step(answer)[4]["success"] is success


def test_a_gem_game_ended_by_max_turns_is_no_success() -> None:
    pytest.importorskip("gem")
    env = make_env("game:GuessTheNumber-v0", min_number=1, max_number=20, max_turns=1)
    env.reset(seed=0)
    number = env.env.game_number
    _, reward, terminated, truncated, info = env.step(f"\\boxed{{{number % 20 + 1}}}")
    assert (terminated, truncated, info["success"]) == (True, True, False) and reward < 1
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(f"\\boxed{{{number}}}")
    assert (terminated, info["success"]) == (True, True) and reward >= 1
