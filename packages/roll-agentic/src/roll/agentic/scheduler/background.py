"""Asynchronous agentic rollouts (``async_generation_ratio`` > 0): env groups keep playing while the actor trains.

A background thread runs the training scheduler's event loop without stopping: it starts rounds (one group's
``group_size`` episodes on one seed) as long as roll's bounded-staleness rule admits them, judges each finished
round as the synchronous scheduler does (faulted / filtered rounds give their place back), and puts kept rounds in
the RLVR pipeline's :class:`~roll.pipelines.rlvr.replay.ReplayBuffer`. Step ``k`` takes its groups from the buffer
(oldest first), training the policy of version ``k - 1``; a round's version is the oldest weights behind any of its
turns (the ``policy_version`` column, stamped by a :class:`~roll.agentic.policy.gate.GatedPolicyClient`).

A step's launch budget is the synchronous step's: ``groups x max_launch_factor`` rounds. When that many rounds in a
row since the last step's take were dropped (faulted or filtered), no new round starts until the next
:meth:`BackgroundRollouts.take`, which returns that step with no batch (and every episode played), as a synchronous
step that kept nothing. So the pipeline skips the step, and ``rollout.max_faulted_steps`` stops the run after that
many such steps in a row whose rounds faulted (:mod:`roll.agentic.scheduler.faulted_steps`; a group filter that drops
every round is no fault: its steps train on nothing and the run goes on, as a synchronous run does). Such a step
consumes nothing, so it does not let admission run a step further ahead, though its weight sync moves the version on.
Counts in a step's metrics are of what happened since the last take: a round launched before it and judged after
counts as launched in one step and kept, filtered or faulted in the next.

A checkpoint is written while rounds are still playing or wait in the buffer: :meth:`BackgroundRollouts.state`
lists them (launched, not trained on), and a resumed run plays them again first, with the same seeds, so it trains
on the rounds an uninterrupted run would; only the policy that samples them is newer.

ROLL's semantics (``GroupQueue.advance_step`` / ``GroupQueueManager.get_batch`` in ROLL's rollout_scheduler.py):
generation runs at most ``ratio`` steps ahead of training, a group older than ``ratio`` versions is never trained
on (dropped and replaced), and weights change only at step boundaries, where generation is paused.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from roll.agentic.env_manager import EpisodeResult, concat_samples
from roll.agentic.scheduler.faulted_steps import describe_faults
from roll.agentic.scheduler.metrics import summarize_episodes
from roll.agentic.scheduler.scheduler import RolloutBatch, RolloutScheduler, _cancel_pending, _Round
from roll.pipelines.rlvr.replay import FinishedGroup, ReplayBuffer

__all__ = ["BackgroundRollouts"]

logger = logging.getLogger(__name__)
_POLL_S = 0.02


def round_version(round_: _Round) -> int:
    """The oldest policy version behind any turn of a kept round."""
    return min(int(min(r.batch.non_tensor_batch["policy_version"])) for r in round_.results if r.batch is not None)


class BackgroundRollouts:
    """Keeps ``scheduler`` (mode train) playing in a thread; :meth:`take` returns a step's batch.

    ``version`` is the engine's policy version now (0, or the step a resumed run starts after); call
    :meth:`set_version` after each weight sync, while generation is paused.
    """

    def __init__(
        self,
        scheduler: RolloutScheduler,
        *,
        batch_size: int,
        ratio: float,
        version: int = 0,
        buffer_state: Mapping[str, Any] | None = None,
    ) -> None:
        self.scheduler = scheduler
        groups_per_step = scheduler.config.groups_for(batch_size)
        self.buffer: ReplayBuffer[_Round] = ReplayBuffer(groups_per_step, ratio)
        if buffer_state:  # a resumed run: its staleness metrics go on from the checkpoint's (state()'s "buffer")
            self.buffer.load_state_dict(buffer_state)
        self.base = self.version = version
        self.groups_per_step = groups_per_step
        self.launch_budget = groups_per_step * scheduler.max_launch_factor
        """Rounds dropped in a row (since the last take) that end a step with nothing to train, as a synchronous
        step's launch limit does."""
        self._dropped_in_a_row = 0
        self._spent = False
        """The step's launch budget was dropped: no launch until the next take, which returns no batch."""
        self._empty_steps = 0
        """Steps that took nothing: the version still moves on at their weight sync, but admission must not (it
        counts a step's groups as consumed per version), or the groups admitted ahead would go stale unused."""
        self._cond = threading.Condition()
        self._played: list[EpisodeResult] = []
        self._counts: Counter[str] = Counter()
        self._in_flight: dict[asyncio.Future[_Round], tuple[int, int, int]] = {}
        """The rounds playing: ``(group_id, episode_id, launch)``, in launch order."""
        self._launches = 0
        self._error: BaseException | None = None
        self._stop = False
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=f"{scheduler.config.name}-rollouts", daemon=True)
        self._thread.start()

    # --- the producer (background thread) ------------------------------------------------------------------
    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._produce())
        except BaseException as e:  # handed to the trainer at its next take()
            logger.exception("background rollouts of %s failed", self.scheduler.config.name)
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _launch(self) -> None:
        running = self._in_flight
        trained = max(self.version - self.base - self._empty_steps, 0)  # versions that consumed a step's groups
        while not self._spent and self.buffer.may_admit(trained):
            picked = self.scheduler._next_round({group_id for group_id, _, _ in running.values()}, Counter())
            if picked is None:
                return
            plan, episode_id = picked
            self.buffer.admit()
            self._counts["groups_launched"] += 1
            launch, self._launches = self._launches, self._launches + 1
            future = asyncio.ensure_future(self.scheduler._play(plan, episode_id, launch))
            running[future] = (plan.group_id, episode_id, launch)

    def _finish(self, round_: _Round) -> None:
        verdict = self.scheduler._settle(round_, self._played, self._counts)
        if verdict == "groups_kept":
            key = (round_.plan.group_id, round_.episode_id)
            size = len(round_.results)
            self.buffer.put(FinishedGroup(key, round_version(round_), round_, size))
            self._dropped_in_a_row = 0
            self._cond.notify_all()
            return
        for result in round_.results:
            result.batch = None  # dropped: keep the summary, free the tensors
        self.buffer.discard()  # its place goes to a new round
        self._dropped_in_a_row += 1
        if self._dropped_in_a_row >= self.launch_budget:
            self._spent = True  # the waiting take() returns a step with nothing to train
            self._cond.notify_all()

    async def _produce(self) -> None:
        running = self._in_flight
        try:
            while not self._stop:
                with self._cond:
                    self._launch()
                if not running:
                    await asyncio.sleep(_POLL_S)
                    continue
                done, _ = await asyncio.wait(running, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for future in [f for f in running if f in done]:  # in launch order: the buffer's order is no race
                    round_ = future.result()
                    with self._cond:  # a round is always either playing or judged for state()
                        del running[future]
                        self._finish(round_)
        finally:
            for future in running:
                future.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    # --- the trainer's side ----------------------------------------------------------------------------------
    def take(self, step: int, timeout_s: float | None = None) -> RolloutBatch:
        """Step ``step``'s groups (policy versions in ``[step - 1 - bound, step - 1]``), waiting for them; no batch
        (``batch`` None) once the step's launch budget was dropped in a row (see the module docstring)."""
        train_version = step - 1
        # one deadline for the whole wait: every kept round wakes the wait, so a timeout per wake never ran out
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                groups = self.buffer.take(train_version)
                if groups is not None:
                    break
                if self._spent:
                    groups = []
                    self._empty_steps += 1
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"step {step}: no batch after {timeout_s} s ({self.buffer.metrics()})")
                self._cond.wait(timeout=left)
            played, counts = self._played, self._counts
            self._played, self._counts = [], Counter()
            self._dropped_in_a_row, self._spent = 0, False  # the next step's budget starts now
            metrics = self._metrics(played, counts, groups, train_version)
        if not groups:
            logger.warning(
                "%s: step %d has nothing to train: the last %d rounds were all dropped (%s; %s)",
                self.scheduler.config.name,
                step,
                self.launch_budget,
                dict(counts),
                describe_faults(played),
            )
            return RolloutBatch(None, played, metrics)
        batches = [r.batch for g in groups for r in g.payload.results if r.batch is not None]
        batch = concat_samples(batches, self.scheduler.pad_token_id)
        return RolloutBatch(batch, played, metrics)

    def _metrics(
        self, played: list[EpisodeResult], counts: Counter[str], groups: list[FinishedGroup[_Round]], version: int
    ) -> dict[str, float]:
        metrics = summarize_episodes(played, "rollout")
        self.scheduler.warn_context_limits(played)
        counts["episodes"] = len(played)
        counts["env_faults"] = sum(r.faulted for r in played)
        metrics.update({f"rollout/{key}": float(value) for key, value in counts.items()})
        metrics.update({f"rollout/{key}": value for key, value in self.scheduler.executor.stats().items()})
        metrics.update(self.buffer.metrics())
        staleness = [version - g.version for g in groups]
        if staleness:  # none in a step whose launch budget was all dropped
            metrics["async/batch_staleness_max"] = float(max(staleness))
            metrics["async/batch_staleness_mean"] = sum(staleness) / len(staleness)
        metrics["async/generating_groups"] = float(len(self._in_flight))
        return metrics

    def set_version(self, version: int) -> None:
        """The engine now holds ``version`` (after a weight sync): admission moves on."""
        with self._cond:
            self.version = version

    def accounting(self) -> dict[str, int]:
        """Admitted rounds = consumed + discarded + ready + generating (every round is used once or dropped)."""
        with self._cond:
            buffer = self.buffer
            return {
                "admitted": buffer.admitted,
                "consumed": buffer.consumed,
                "discarded": buffer.discarded,
                "ready": len(buffer),
                "generating": len(self._in_flight),
            }

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=60)
        if not self._thread.is_alive():
            # the policy client's tasks (ClusterPolicyClient's batcher never returns), as the synchronous scheduler does
            _cancel_pending(self.loop)
            self.loop.close()

    def state(self) -> dict[str, Any]:
        """The training scheduler's :meth:`~RolloutScheduler.state` for a checkpoint, taken while generation goes
        on: the rounds launched but not trained on (playing, or ready in the buffer) are saved to be played again,
        with the same seeds, when the run resumes; rounds dropped (faulted, filtered, stale) are not. Under ``buffer``,
        the replay buffer's staleness counters (pass them back as ``buffer_state`` on resume)."""
        with self._cond:
            pending = [(g.payload.launch, g.payload.plan.group_id, g.payload.episode_id) for g in self.buffer.ready]
            pending += [(launch, group_id, episode_id) for group_id, episode_id, launch in self._in_flight.values()]
            rounds = [(group_id, episode_id) for _, group_id, episode_id in sorted(pending)]
            return {**self.scheduler.state(pending=rounds), "buffer": self.buffer.state_dict()}
