"""Group filters: decide, when a group's episodes are all done, whether to drop the group from the batch.

A filter is a class built with ``(env_manager_config, mode)`` whose ``filter(group_id, episode_id, episodes)``
returns True to drop the group (``episodes`` are :class:`~roll.agentic.env_manager.EpisodeResult`, each with its
samples in ``.batch``). Name one with ``group_filter_cls`` (an import path).
"""

from __future__ import annotations

from typing import Any

from roll.agentic.env_manager import EpisodeResult

__all__ = ["GroupFilter", "ZeroVarianceGroupFilter"]


class GroupFilter:
    """Keeps every group (ROLL's default)."""

    def __init__(self, env_manager_config: Any = None, mode: str = "train") -> None:
        self.env_manager_config, self.mode = env_manager_config, mode

    def filter(self, group_id: int, episode_id: int, episodes: list[EpisodeResult]) -> bool:
        return False


class ZeroVarianceGroupFilter(GroupFilter):
    """Drops groups whose episodes all scored the same: their group-relative advantage is zero everywhere."""

    def __init__(self, env_manager_config: Any = None, mode: str = "train", eps: float = 1e-6) -> None:
        super().__init__(env_manager_config, mode)
        self.eps = eps

    def filter(self, group_id: int, episode_id: int, episodes: list[EpisodeResult]) -> bool:
        scores = [e.episode_score for e in episodes]
        return len(scores) > 1 and max(scores) - min(scores) <= self.eps
