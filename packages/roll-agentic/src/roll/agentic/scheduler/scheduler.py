"""RolloutScheduler: plays groups of episodes until a batch of ``rollout_batch_size`` trajectories is ready.

Each env group plays rounds; in a round all ``group_size`` envs of the group play the same seed. Groups run
concurrently (as many as the batch still needs), so a group that finishes early frees its slots for the next
round at once. When a round is done, training mode checks it: a round with a faulted or aborted episode is
dropped (``groups_faulted``), the ``group_filter_cls`` may drop it (``groups_filtered``), and a replacement round
is started, up to ``max_launch_factor`` (the manager's setting) times the groups needed. A round dropped at its
first try is replaced by its own group's next episode (the group is free: its round just ended; ROLL's groups also
play on after a drop), so a step that drops each group at most once plays the same rounds, in the same batch order,
whichever group finished first. A replacement dropped again goes to the next free group (timing decides which), so
that a tag whose rounds are always dropped cannot hold the batch to its own groups; so does one whose group reached
``max_traj_per_env`` or has a carried-over round waiting. Validation mode keeps every round (faulted
episodes count as failures) and replays the same seeds on every call, so validations are comparable. Its seeds are
hashed like training's, except for tags whose env picks items by seed (``Env.seed_is_index``, e.g. ``roll_math``):
their n-th validation round (in the fixed val order) gets the seed n, so a val run walks the dataset in order.

With ``group_size_redundancy`` a group has that many more envs: a round plays them all on its seed, keeps the first
``group_size`` episodes to finish without an env fault (in env order in the batch) and cancels the others; a round
with too few such episodes keeps its first ``group_size`` and is judged faulted. Training's metrics count the other
finished episodes too; validation's read each round's ``group_size`` only.

Every episode also gets a sampling seed (:func:`~roll.agentic.scheduler.plan.sampling_seed`: the scheduler's seed,
the round, the env slot, and for validation the global step), from which its turns' requests are seeded: with an
engine that honours request seeds, the same seed plays the same episodes however the turns were batched.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env import resolve_env_factory
from roll.agentic.env.base import EnvOutputError
from roll.agentic.env_manager import EpisodeResult, EpisodeTask, concat_samples
from roll.agentic.policy.protocol import PolicyClient
from roll.agentic.pool import EnvPool
from roll.agentic.scheduler.executors import EpisodeExecutor, LocalExecutor, RayExecutor
from roll.agentic.scheduler.metrics import summarize_episodes, warn_context_limits
from roll.agentic.scheduler.plan import (
    GroupPlan,
    episode_ids,
    episode_seed,
    plan_groups,
    sampling_seed,
    slots_by_rank,
)
from roll.agentic.worker import EnvWorkerSetup, load_tokenizer
from roll.protocol import DataProto
from roll.runtime import ConfigError, ResourceManager, import_target
from roll.strategies import GenerationConfig

__all__ = ["RolloutBatch", "RolloutScheduler", "check_custom_envs"]

logger = logging.getLogger(__name__)
Mode = Literal["train", "val"]


@dataclass
class RolloutBatch:
    """One ``get_batch``: the samples of the kept rounds, every episode played, and metrics."""

    batch: DataProto | None
    episodes: list[EpisodeResult] = field(default_factory=list)
    """Every episode played in this call, kept or not (dropped ones without their samples)."""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(eq=False)  # rounds are told apart by identity (a dropped one is taken out of a queue)
class _Round:
    plan: GroupPlan
    episode_id: int
    launch: int
    """Launch number within the call."""
    results: list[EpisodeResult]
    place: tuple[int, int] = (0, 0)
    """Where its samples go in the batch, not the timing-dependent finish order: (the launch that started its chain
    of replacements, its number in the chain)."""
    extra: list[EpisodeResult] = field(default_factory=list)
    """With ``group_size_redundancy``: episodes that finished but are not among the round's ``group_size`` (a faulted
    one passed over, or one finishing with the last kept ones); counted in the metrics, not trained on."""
    cancelled: int = 0
    """With ``group_size_redundancy``: episodes cancelled once ``group_size`` others had finished."""


def check_custom_envs(config: EnvManagerConfig, custom_envs: dict[str, CustomEnvConfig]) -> None:
    """Every tag of ``config`` is defined, and all use one sample layout (rows of one batch must match)."""
    missing = sorted(set(config.tags) - set(custom_envs))
    if missing:
        raise ConfigError(f"{config.name}.tags {missing} are not defined in custom_envs ({sorted(custom_envs)})")
    layouts = {custom_envs[tag].env_manager_cls for tag in config.tags}
    if len(layouts) > 1:
        raise ConfigError(
            f"{config.name}.tags mix env managers {sorted(layouts)}; one batch needs one sample layout: "
            f"use the same env_manager_cls for all tags of a manager"
        )


def index_seeded_tags(config: EnvManagerConfig, custom_envs: dict[str, CustomEnvConfig]) -> set[str]:
    """The tags of ``config`` whose env picks items by seed (``seed_is_index``): validated in item order."""
    return {
        tag for tag in config.tags if getattr(resolve_env_factory(custom_envs[tag].env_type), "seed_is_index", False)
    }


class RolloutScheduler:
    """Groups, seeds, filters and batch assembly over an :class:`EpisodeExecutor` (local or Ray)."""

    def __init__(
        self,
        config: EnvManagerConfig,
        executor: EpisodeExecutor,
        *,
        pad_token_id: int,
        mode: Mode = "train",
        seed: int = 0,
        max_launch_factor: int | None = None,
        index_seeded_tags: Collection[str] = (),
    ) -> None:
        """``index_seeded_tags``: tags validated with the seeds 0, 1, 2, ... (see the module docstring);
        ``max_launch_factor``: None takes the manager's (``config.max_launch_factor``)."""
        if mode not in ("train", "val"):
            raise ConfigError(f"scheduler mode must be 'train' or 'val', got {mode!r}")
        self.config, self.executor, self.pad_token_id = config, executor, pad_token_id
        self.mode, self.seed = mode, seed
        self.max_launch_factor = config.max_launch_factor if max_launch_factor is None else max_launch_factor
        if self.max_launch_factor < 1:
            raise ConfigError(f"max_launch_factor must be at least 1, got {self.max_launch_factor}")
        self.groups = plan_groups(config)
        self.index_seeded_tags = frozenset(index_seeded_tags)
        self.group_filter = import_target(config.group_filter_cls, f"{config.name}.group_filter_cls")(config, mode)
        self._next_episode = [0] * len(self.groups)
        self._cursor = 0
        self._context_warned: set[str] = set()
        self._replay: deque[tuple[int, int]] = deque()
        """Rounds ``(group_id, episode_id)`` a checkpoint carried over (launched, not trained on): played first."""
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- construction -----------------------------------------------------------------------------------
    @classmethod
    def local(
        cls,
        config: EnvManagerConfig,
        custom_envs: dict[str, CustomEnvConfig],
        tokenizer: Any,
        client: PolicyClient,
        *,
        sequence_length: int,
        generation_config: GenerationConfig | None = None,
        mode: Mode = "train",
        seed: int = 0,
        **kwargs: Any,
    ) -> RolloutScheduler:
        """Every env in this process (tests, benchmarks, small runs).

        ``generation_config`` defaults to ``config.generating_args`` (then to GenerationConfig's defaults).
        """
        check_custom_envs(config, custom_envs)
        generation_config = generation_config or config.generating_args or GenerationConfig()
        tokenizer = load_tokenizer(tokenizer)
        pool = EnvPool(
            custom_envs,
            tokenizer,
            client,
            generation_config=generation_config,
            sequence_length=sequence_length,
            llm_proxy=config.llm_proxy,
        )
        slots = [slot for plan in plan_groups(config) for slot in plan.slots()]
        indexed = index_seeded_tags(config, custom_envs) if mode == "val" else set()
        executor = LocalExecutor(pool, slots)
        return cls(
            config, executor, pad_token_id=pool.pad_token_id, mode=mode, seed=seed, index_seeded_tags=indexed, **kwargs
        )

    @classmethod
    def on_ray(
        cls,
        config: EnvManagerConfig,
        custom_envs: dict[str, CustomEnvConfig],
        tokenizer: Any,
        client: PolicyClient,
        *,
        sequence_length: int,
        resource_manager: ResourceManager,
        generation_config: GenerationConfig | None = None,
        mode: Mode = "train",
        seed: int = 0,
        **kwargs: Any,
    ) -> RolloutScheduler:
        """Envs on ``config.world_size`` EnvironmentWorker actors (``client`` must be picklable)."""
        check_custom_envs(config, custom_envs)
        generation_config = generation_config or config.generating_args or GenerationConfig()
        tok = load_tokenizer(tokenizer)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        setup = EnvWorkerSetup(
            custom_envs={tag: custom_envs[tag] for tag in config.tags},
            tokenizer=tokenizer,
            client=client,
            generation_config=generation_config,
            sequence_length=sequence_length,
            slots=slots_by_rank(config, plan_groups(config)),
            llm_proxy=config.llm_proxy,
        )
        executor = RayExecutor.create(config, resource_manager, setup)
        indexed = index_seeded_tags(config, custom_envs) if mode == "val" else set()
        return cls(config, executor, pad_token_id=int(pad), mode=mode, seed=seed, index_seeded_tags=indexed, **kwargs)

    # --- batches ----------------------------------------------------------------------------------------
    def get_batch(self, batch_size: int | None = None, global_step: int = 0) -> RolloutBatch:
        """``batch_size`` trajectories (a multiple of ``group_size``); ``None`` plays every group once."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.aget_batch(batch_size, global_step))

    async def aget_batch(self, batch_size: int | None = None, global_step: int = 0) -> RolloutBatch:
        needed = self.config.groups_for(batch_size)
        # Validation replays its rounds at every call; the global step makes each call's samples its own.
        kept, played, counts = await self._collect(needed, global_step if self.mode == "val" else 0)
        batches = [r.batch for round_ in kept for r in round_.results if r.batch is not None]
        batch = concat_samples(batches, self.pad_token_id) if batches else None
        prefix = "val" if self.mode == "val" else "rollout"
        metrics = summarize_episodes(played, prefix)
        self.warn_context_limits(played)
        metrics.update({f"{prefix}/{key}": float(value) for key, value in counts.items()})
        metrics.update({f"{prefix}/{key}": value for key, value in self.executor.stats().items()})
        faults = [r for r in played if r.faulted]
        if played and all(r.end_reason == "env_malformed" for r in played):
            # Not a flaky env but one that does not follow the contract: every step would train on nothing.
            first = faults[0]
            raise EnvOutputError(
                f"{self.config.name}: every episode ({len(played)}) ended env_malformed, e.g. env tag "
                f"{first.task.tag!r}: {first.error}; fix the env's reset()/step() (roll.agentic.env.base)"
            )
        if len(kept) < needed:
            example = f"; e.g. tag {faults[0].task.tag!r} {faults[0].end_reason}: {faults[0].error}" if faults else ""
            logger.warning(
                "%s: kept %d of %d groups (%s)%s", self.config.name, len(kept), needed, dict(counts), example
            )
        return RolloutBatch(batch, played, metrics)

    def warn_context_limits(self, played: list[EpisodeResult]) -> None:
        """A warning, once per tag and run, when the played episodes were cut by the context (``context_limit``)."""
        warn_context_limits(played, where=self.config.name, warned=self._context_warned)

    # --- state ------------------------------------------------------------------------------------------
    def state(self, pending: Iterable[tuple[int, int]] = ()) -> dict[str, Any]:
        """Where the training rounds stand (each group's next episode, the round-robin cursor): kept in a run's
        checkpoint, so that a resumed run plays the seeds an uninterrupted one would.

        ``pending``: rounds ``(group_id, episode_id)`` already launched but not trained on (asynchronous rollouts:
        playing, or ready in the buffer), in launch order; saved with the carried-over rounds not yet replayed as
        ``replay``, which a resumed run plays first, with the same seeds. A synchronous step leaves none pending."""
        state: dict[str, Any] = {"next_episode": list(self._next_episode), "cursor": self._cursor}
        replay = [[group_id, episode_id] for group_id, episode_id in (*pending, *self._replay)]
        if replay:
            state["replay"] = replay
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (a checkpoint written before the cursor was kept starts it at 0)."""
        saved = [int(v) for v in state["next_episode"]]
        if len(saved) != len(self.groups):
            raise ConfigError(
                f"the checkpoint's {self.config.name} has {len(saved)} env groups and this config "
                f"{len(self.groups)}: resume with the num_env_groups it was saved with (or start a new run)"
            )
        self._next_episode = saved
        self._cursor = int(state.get("cursor", 0))
        self._replay = deque((int(group_id), int(episode_id)) for group_id, episode_id in state.get("replay", []))

    def _val_rounds(self, needed: int) -> list[tuple[GroupPlan, int]]:
        """Validation's rounds, fixed whatever the timing: every group's episode 0 in group order, then every
        group's episode 1, and so on, ``needed`` in all; the same at every validation."""
        count = len(self.groups)
        return [(self.groups[i % count], i // count) for i in range(needed)]

    def _may_play(self, group_id: int, busy: set[int], rounds: Counter[int]) -> bool:
        """Whether the group is free and below ``max_traj_per_env`` rounds in this call."""
        cap = self.config.max_traj_per_env
        return group_id not in busy and not (cap > 0 and rounds[group_id] >= cap)

    def _next_episode_of(self, plan: GroupPlan) -> tuple[GroupPlan, int]:
        episode_id = self._next_episode[plan.group_id]
        self._next_episode[plan.group_id] += 1
        return plan, episode_id

    def _next_free(self, busy: set[int], rounds: Counter[int]) -> GroupPlan | None:
        for offset in range(len(self.groups)):
            plan = self.groups[(self._cursor + offset) % len(self.groups)]
            if self._may_play(plan.group_id, busy, rounds):
                self._cursor = (self._cursor + offset + 1) % len(self.groups)
                return plan
        return None

    def _next_round(self, busy: set[int], rounds: Counter[int]) -> tuple[GroupPlan, int] | None:
        """The next training round: the rounds a checkpoint carried over first, in their launch order (the next
        one waits while its group is busy; past one whose group reached ``max_traj_per_env`` in this call, the
        first of another group), then the next free group's next episode."""
        if self._replay:
            if self._replay[0][0] in busy:
                return None
            waiting: set[int] = set()
            for index, (group_id, episode_id) in enumerate(self._replay):
                if self._may_play(group_id, busy | waiting, rounds):
                    del self._replay[index]
                    return self.groups[group_id], episode_id
                waiting.add(group_id)
            busy = busy | waiting  # a group plays its carried-over rounds before new ones
        plan = self._next_free(busy, rounds)
        return None if plan is None else self._next_episode_of(plan)

    def _replacement(
        self, dropped: deque[_Round], busy: set[int], rounds: Counter[int]
    ) -> tuple[tuple[GroupPlan, int] | None, _Round | None]:
        """The next training round, and the dropped round it replaces (None: a new round). A round dropped at its first
        try takes its own group's next episode (unless that group reached ``max_traj_per_env`` or has a carried-over
        round waiting), ahead of the replacements waiting for the next free group, which could otherwise take that
        group; those, oldest first, and new rounds take the next free group."""
        carried = {group_id for group_id, _ in self._replay}
        for round_ in dropped:
            group_id = round_.plan.group_id
            if round_.place[1] == 0 and group_id not in carried and self._may_play(group_id, busy, rounds):
                return self._next_episode_of(round_.plan), round_
        return self._next_round(busy, rounds), (dropped[0] if dropped else None)

    def _seed(self, plan: GroupPlan, episode_id: int) -> int:
        if self.mode == "val" and plan.tag in self.index_seeded_tags:
            # the round's place among its tag's val rounds: every group's episode 0 in group order, then episode 1...
            peers = [group.group_id for group in self.groups if group.tag == plan.tag]
            return episode_id * len(peers) + peers.index(plan.group_id)
        return episode_seed(self.seed, plan.group_id, episode_id)

    async def _play(
        self, plan: GroupPlan, episode_id: int, launch: int, draw: int = 0, place: tuple[int, int] | None = None
    ) -> _Round:
        seed = self._seed(plan, episode_id)
        episodes = []
        for env_id in plan.env_ids:
            traj_group_id, traj_id = episode_ids(plan.tag, plan.group_id, episode_id, seed, env_id)
            sampling = sampling_seed(self.seed, plan.group_id, episode_id, env_id, draw)
            task = EpisodeTask(env_id, plan.group_id, plan.tag, episode_id, seed, traj_group_id, traj_id, sampling)
            episodes.append(asyncio.ensure_future(self.executor.run(task)))
        try:
            results, extra = await self._first_finished(episodes)
        except BaseException:
            # stop the episodes still running, or they stay parked on the loop holding what they hold (a gated
            # policy client's request, which a weight sync's pause waits for)
            for episode in episodes:
                episode.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            raise
        cancelled = len(episodes) - len(results) - len(extra)
        return _Round(plan, episode_id, launch, results, place or (launch, 0), extra, cancelled)

    async def _first_finished(
        self, episodes: Sequence[asyncio.Future[EpisodeResult]]
    ) -> tuple[list[EpisodeResult], list[EpisodeResult]]:
        """The round's ``group_size`` episodes in env order, and the other finished ones: without
        ``group_size_redundancy`` all of them; with it, the first ``group_size`` to finish without an env fault (those
        still running then are cancelled and awaited), or, when too few do, the first ``group_size`` to finish (the
        round is then judged faulted)."""
        size = self.config.group_size
        if len(episodes) == size:
            return list(await asyncio.gather(*episodes)), []
        finished: list[asyncio.Future[EpisodeResult]] = []
        pending = set(episodes)
        while pending and sum(not f.result().faulted for f in finished) < size:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finished.extend(sorted(done, key=episodes.index))  # ties in env order
        for episode in pending:
            episode.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        healthy = [f for f in finished if not f.result().faulted]
        chosen = healthy[:size] if len(healthy) >= size else finished[:size]
        extra = [f.result() for f in finished if f not in chosen]
        for result in extra:
            result.batch = None  # not trained on: keep the summary, free the tensors
        return [f.result() for f in sorted(chosen, key=episodes.index)], extra

    def _settle(self, round_: _Round, played: list[EpisodeResult], counts: Counter[str]) -> str:
        """Judge a finished round and count it: its episodes go to ``played`` (validation reads only its
        ``group_size``, training also the others that finished), its verdict and cancelled redundant episodes to
        ``counts``. Returns the verdict."""
        played.extend(round_.results if self.mode == "val" else [*round_.results, *round_.extra])
        if self.config.group_size_redundancy:
            counts["episodes_cancelled"] += round_.cancelled
        verdict = self._judge(round_)
        counts[verdict] += 1
        return verdict

    def _judge(self, round_: _Round) -> str:
        if self.mode == "val":
            return "groups_kept"
        if any(r.batch is None for r in round_.results):
            return "groups_faulted"
        if self.group_filter.filter(round_.plan.group_id, round_.episode_id, round_.results):
            return "groups_filtered"
        return "groups_kept"

    async def _collect(self, needed: int, draw: int) -> tuple[list[_Round], list[EpisodeResult], Counter[str]]:
        kept: list[_Round] = []
        played: list[EpisodeResult] = []
        counts: Counter[str] = Counter()
        running: dict[asyncio.Future[_Round], int] = {}
        rounds: Counter[int] = Counter()
        planned = self._val_rounds(needed) if self.mode == "val" else None
        cap = needed if self.mode == "val" else needed * self.max_launch_factor
        dropped: deque[_Round] = deque()  # training rounds to replace, oldest first
        try:
            while len(kept) < needed:
                while len(kept) + len(running) < needed and counts["groups_launched"] < cap:
                    busy = set(running.values())
                    launch, place = counts["groups_launched"], None
                    if planned is not None:  # the first planned round whose group is free (its earlier ones ran)
                        pick = next((i for i, (p, _) in enumerate(planned) if p.group_id not in busy), None)
                        if pick is None:
                            break
                        plan, episode_id = planned.pop(pick)
                    else:
                        picked, replaces = self._replacement(dropped, busy, rounds)
                        if picked is None:
                            break
                        plan, episode_id = picked
                        if replaces is not None:
                            dropped.remove(replaces)
                            place = (replaces.place[0], replaces.place[1] + 1)
                    rounds[plan.group_id] += 1
                    counts["groups_launched"] += 1
                    running[asyncio.ensure_future(self._play(plan, episode_id, launch, draw, place))] = plan.group_id
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: f.result().place):
                    del running[future]
                    round_ = future.result()
                    verdict = self._settle(round_, played, counts)
                    if verdict == "groups_kept":
                        kept.append(round_)
                    else:
                        dropped.append(round_)
                        for result in round_.results:
                            result.batch = None  # dropped: keep the summary, free the tensors
        finally:
            for future in running:  # only on error: do not leave episodes running unobserved
                future.cancel()
        counts["episodes"] = len(played)
        counts["env_faults"] = sum(r.faulted for r in played)
        kept.sort(key=lambda r: r.place)
        return kept, played, counts

    def close(self) -> None:
        self.executor.close()
        if self._loop is not None:
            _cancel_pending(self._loop)  # e.g. a policy client's serve task, parked on this loop
            self._loop.close()
            self._loop = None


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still parked on ``loop`` and let them finish, so none is destroyed pending."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
