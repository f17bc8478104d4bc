"""Env layout: groups per tag, slots per worker, seeds shared within a group round."""

from __future__ import annotations

import pytest

from roll.agentic.config import EnvManagerConfig
from roll.agentic.scheduler import episode_ids, episode_seed, plan_groups, slots_by_rank
from roll.runtime import ConfigError


def test_groups_follow_the_partition() -> None:
    config = EnvManagerConfig(num_env_groups=5, group_size=3, tags=["A", "B"], num_groups_partition=[2, 3])
    groups = plan_groups(config)
    assert [g.tag for g in groups] == ["A", "A", "B", "B", "B"]
    assert [g.env_ids for g in groups][:2] == [(0, 1, 2), (3, 4, 5)]
    assert groups[-1].env_ids == (12, 13, 14)


def test_default_partition_splits_evenly() -> None:
    config = EnvManagerConfig(num_env_groups=5, tags=["A", "B"])
    assert config.num_groups_partition == [3, 2]
    with pytest.raises(ConfigError, match="summing to num_env_groups=5"):
        EnvManagerConfig(num_env_groups=5, tags=["A", "B"], num_groups_partition=[1, 1])


def test_slots_by_rank_and_world_size() -> None:
    config = EnvManagerConfig(num_env_groups=3, group_size=4, tags=["A"], max_env_num_per_worker=5)
    assert config.world_size == 3  # 12 envs, 5 per worker
    slots = slots_by_rank(config, plan_groups(config))
    assert [[s.env_id for s in slots[r]] for r in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert slots[1][0].group_id == 1 and slots[1][-1].group_id == 2  # a group may span two workers
    assert EnvManagerConfig(num_env_groups=3, group_size=4, tags=["A"]).world_size == 1


def test_seeds_are_stable_and_distinct() -> None:
    seeds = {episode_seed(7, g, e) for g in range(20) for e in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**31 for s in seeds)
    assert episode_seed(7, 3, 4) == episode_seed(7, 3, 4) != episode_seed(8, 3, 4)
    assert episode_ids("FL", 3, 4, 99, 13) == ("FL_3_4_99", "FL_3_4_99_13")


def test_roll_yaml_names_are_accepted() -> None:
    config = EnvManagerConfig(
        tags=["A"],
        worker_cls="roll.pipeline.agentic.environment_worker.EnvironmentWorker",
        group_filter_cls="roll.pipeline.agentic.agentic_pipeline.GroupFilter",
    )
    assert config.worker_cls == "roll.agentic.worker.EnvironmentWorker"
    assert config.group_filter_cls == "roll.agentic.scheduler.filters.GroupFilter"
