"""Where episodes run: in this process (:class:`LocalExecutor`) or on EnvironmentWorker actors
(:class:`RayExecutor`), behind one interface, ``await executor.run(task) -> EpisodeResult``.

The Ray executor survives worker deaths: when a worker's actor dies, its env slots move to the live workers
(least loaded first), and every episode that was running there is played again from its seed on the slot's new
worker, so each episode is delivered exactly once.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError, RayTaskError

from roll.agentic._ray_calls import await_call
from roll.agentic.config import EnvManagerConfig
from roll.agentic.env_manager import EpisodeResult, EpisodeTask
from roll.agentic.pool import EnvPool, EnvSlot
from roll.agentic.worker import EnvWorkerSetup
from roll.runtime import Cluster, ResourceManager, RollError, WorkerError

__all__ = ["EpisodeExecutor", "LocalExecutor", "RayExecutor"]

logger = logging.getLogger(__name__)


class EpisodeExecutor(Protocol):
    async def run(self, task: EpisodeTask) -> EpisodeResult: ...

    def stats(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Episodes in this process, on the caller's event loop."""

    def __init__(self, pool: EnvPool, slots: list[EnvSlot]) -> None:
        self.pool = pool
        pool.add_slots(slots)

    async def run(self, task: EpisodeTask) -> EpisodeResult:
        return await self.pool.run_episode(task)

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.pool.close()


class AllWorkersLostError(RollError):
    """Every EnvironmentWorker of a role died; the rollout cannot continue."""


class RayExecutor:
    """Episodes on the EnvironmentWorkers of ``cluster`` (already initialized with their slots)."""

    def __init__(self, cluster: Any, slots: dict[int, list[EnvSlot]]) -> None:
        self.cluster = cluster
        self.owner: dict[int, int] = {slot.env_id: rank for rank, rank_slots in slots.items() for slot in rank_slots}
        self.slots: dict[int, EnvSlot] = {slot.env_id: slot for rank_slots in slots.values() for slot in rank_slots}
        self.alive: set[int] = set(range(len(cluster.workers)))
        self.worker_deaths = 0
        self.episodes_rerun = 0

    @classmethod
    def create(cls, config: EnvManagerConfig, resource_manager: ResourceManager, setup: EnvWorkerSetup) -> RayExecutor:
        """Start ``config.world_size`` EnvironmentWorkers and build their envs."""
        cluster = Cluster(config.name, config.worker_cls, resource_manager, config)
        try:
            cluster.initialize(setup)
        except BaseException:
            cluster.shutdown()
            raise
        return cls(cluster, setup.slots)

    def _load(self, rank: int) -> int:
        return sum(1 for owner in self.owner.values() if owner == rank)

    def _lose(self, rank: int) -> None:
        """Move a dead worker's slots to the live workers, least loaded first (each builds a moved slot's env when
        its first episode arrives)."""
        if rank not in self.alive:
            return  # another episode of the same worker already handled it
        self.alive.discard(rank)
        self.worker_deaths += 1
        if not self.alive:
            raise AllWorkersLostError(f"every worker of {self.cluster.name} died; the rollout cannot continue")
        moved: dict[int, int] = {}
        for env_id in sorted(e for e, owner in self.owner.items() if owner == rank):
            target = min(self.alive, key=lambda r: (self._load(r), r))
            self.owner[env_id] = target
            moved[target] = moved.get(target, 0) + 1
        logger.warning("%s worker %d died; moved its env slots to workers %s", self.cluster.name, rank, moved)

    async def run(self, task: EpisodeTask) -> EpisodeResult:
        while True:
            rank = self.owner[task.env_id]
            try:
                result: EpisodeResult = await await_call(self.cluster.workers[rank].run_episode.remote(task))
                return result
            except RayTaskError as e:
                # First: an error raised inside run_episode, also when it is an actor that the worker called which
                # died (Ray's RayTaskError(ActorDiedError) is both kinds). The worker lives; stop, naming where.
                raise WorkerError(self.cluster.name, rank, f"run_episode({task.traj_id})", str(e)) from None
            except RayActorError:  # the EnvironmentWorker itself died: its slots move, the episode runs again
                self.episodes_rerun += 1
                self._lose(rank)

    def stats(self) -> dict[str, float]:
        return {"workers_alive": float(len(self.alive)), "worker_deaths": float(self.worker_deaths),
                "episodes_rerun": float(self.episodes_rerun)}  # fmt: skip

    def close(self) -> None:
        try:
            if self.alive:
                ray.get([self.cluster.workers[r].close_envs.remote() for r in sorted(self.alive)], timeout=30)
        except (RayActorError, ray.exceptions.GetTimeoutError) as e:
            logger.warning("closing the envs of %s failed: %s", self.cluster.name, e)
        self.cluster.shutdown()
