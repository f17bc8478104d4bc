"""Where every env of a rollout lives: groups, tags, env slots and workers (ROLL's env layout).

Groups ``0..num_env_groups-1`` are assigned to ``tags`` in order by ``num_groups_partition``; group ``g`` owns env
slots ``g*n .. (g+1)*n-1``, ``n`` being ``group_size + group_size_redundancy``; env slot ``e`` starts on worker
``e // max_env_num_per_worker``.
All envs of a group play the same seed in each round (GRPO-style groups).
"""

from __future__ import annotations

from dataclasses import dataclass

from roll.agentic.config import EnvManagerConfig
from roll.agentic.env_manager.base import stable_seed
from roll.agentic.pool import EnvSlot

__all__ = ["GroupPlan", "episode_ids", "episode_seed", "plan_groups", "sampling_seed", "slots_by_rank"]


@dataclass(frozen=True)
class GroupPlan:
    group_id: int
    tag: str
    env_ids: tuple[int, ...]

    def slots(self) -> list[EnvSlot]:
        return [EnvSlot(env_id, self.group_id, self.tag) for env_id in self.env_ids]


def plan_groups(config: EnvManagerConfig) -> list[GroupPlan]:
    groups, group_id = [], 0
    for tag, count in zip(config.tags, config.num_groups_partition or []):
        for _ in range(count):
            first = group_id * config.envs_per_group
            groups.append(GroupPlan(group_id, tag, tuple(range(first, first + config.envs_per_group))))
            group_id += 1
    return groups


def slots_by_rank(config: EnvManagerConfig, groups: list[GroupPlan]) -> dict[int, list[EnvSlot]]:
    per_worker = config.max_env_num_per_worker
    out: dict[int, list[EnvSlot]] = {rank: [] for rank in range(config.world_size or 1)}
    for group in groups:
        for slot in group.slots():
            out[slot.env_id // per_worker].append(slot)
    return out


def episode_seed(base_seed: int, group_id: int, episode_id: int) -> int:
    """The seed all envs of group ``group_id`` use in its ``episode_id``-th round: a stable, well-mixed
    function of the three (the same in every process and run)."""
    return stable_seed(base_seed, group_id, episode_id)


def sampling_seed(base_seed: int, group_id: int, episode_id: int, env_id: int, draw: int = 0) -> int:
    """The base of one episode's per-turn sampling seeds: a stable hash of the scheduler's seed, the round, the
    env slot (the envs of a group share an env seed but sample independently) and ``draw`` (validation passes
    the global step: the same env seeds at every validation, fresh samples)."""
    return stable_seed("sampling", base_seed, group_id, episode_id, env_id, draw)


def episode_ids(tag: str, group_id: int, episode_id: int, seed: int, env_id: int) -> tuple[str, str]:
    """``(traj_group_id, traj_id)``: the group's round, and one env's episode in it."""
    traj_group_id = f"{tag}_{group_id}_{episode_id}_{seed}"
    return traj_group_id, f"{traj_group_id}_{env_id}"
