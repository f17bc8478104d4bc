"""Validation seeds of envs that pick items by seed (``seed_is_index``: roll_math, roll_qa, roll_code): the n-th val
round of such a tag plays seed n, so a val run asks the dataset's questions in order, each once; other tags keep
their hashed seeds, and training hashes every tag's seeds."""

from __future__ import annotations

import json
from collections import Counter

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.policy import MockPolicyClient, RandomActionPolicy
from roll.agentic.scheduler import RolloutScheduler, episode_seed
from roll.strategies import GenerationConfig


def _scheduler(tokenizer, envs, mode, tags, groups) -> RolloutScheduler:
    config = EnvManagerConfig(num_env_groups=sum(groups), group_size=1, tags=tags, num_groups_partition=groups)
    client = MockPolicyClient(tokenizer, RandomActionPolicy(["\\boxed{1}"], template="{}"))
    return RolloutScheduler.local(
        config,
        envs,
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=8),
        sequence_length=512,
        mode=mode,
        seed=5,
    )


def test_val_walks_the_dataset_in_order(tokenizer, tmp_path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(5))
    )
    envs = {
        "Math": CustomEnvConfig(env_type="roll_math", env_config={"dataset_name": str(path)}, max_steps=1),
        "FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 3}, max_steps=1),
    }
    val = _scheduler(tokenizer, envs, "val", ["Math", "FL"], [2, 1])
    out = val.get_batch(9)  # three rounds of each of the 3 groups
    seeds: dict[str, list[int]] = {}
    for episode in sorted(out.episodes, key=lambda e: (e.task.episode_id, e.task.group_id)):
        seeds.setdefault(episode.task.tag, []).append(episode.task.seed)
    assert seeds["Math"] == [0, 1, 2, 3, 4, 5]  # groups 0, 1 take turns: questions 0..4, then question 0 again
    assert seeds["FL"] == [episode_seed(5, 2, e) for e in range(3)]
    again = val.get_batch(9).episodes  # the same seeds at every validation
    assert sorted(e.task.seed for e in again) == sorted(e.task.seed for e in out.episodes)
    train = _scheduler(tokenizer, envs, "train", ["Math", "FL"], [2, 1])
    played = train.get_batch(3).episodes
    assert Counter(e.task.seed == episode_seed(5, e.task.group_id, e.task.episode_id) for e in played) == {True: 3}
    for scheduler in (val, train):
        scheduler.close()
