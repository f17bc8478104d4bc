"""Stopping a run whose env faults leave nothing to train, step after step.

A training step drops every group with a faulted episode (an env that raised, hung past ``step_timeout_s``, returned
malformed output, or a request the policy server dropped) and plays replacements, up to the scheduler's launch limit.
When no group survives, the step trains on nothing; a flaky env makes that happen now and then, and the run goes on.
An env that is broken for good (it raises in every reset, its service is down, its tool is dead) would make it
happen at every step, burning the run's budget on nothing: after ``rollout.max_faulted_steps`` such steps in a row
the run stops with a :class:`RolloutFaultsError` naming the env tags, the fault reasons with their counts and an
example error. Every step before it was logged and checkpointed as usual, so the output folder stays as it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from roll.agentic.env_manager import FAULT_REASONS, EpisodeResult
from roll.agentic.scheduler.scheduler import RolloutBatch
from roll.runtime import RollError

__all__ = ["FaultedSteps", "RolloutFaultsError", "describe_faults"]

_DROPPING = (*FAULT_REASONS, "aborted")
"""End reasons that drop an episode's group from a training batch."""
FIELD = "rollout.max_faulted_steps"


class RolloutFaultsError(RollError):
    """Consecutive training steps had nothing to train: env faults dropped every group they played."""


def describe_faults(episodes: Iterable[EpisodeResult]) -> str:
    """The env tags, fault reasons with counts and one example error of ``episodes``' faulted ones, e.g.
    ``env tags ['Bad']: env_error x8; e.g. tag 'Bad' env_error: reset() raised RuntimeError: down``."""
    dropped = [e for e in episodes if e.end_reason in _DROPPING]
    if not dropped:
        return "no faulted episode"
    reasons = Counter(e.end_reason for e in dropped)
    counts = ", ".join(f"{reason} x{count}" for reason, count in reasons.most_common())
    tags = sorted({e.task.tag for e in dropped})
    example = next((e for e in dropped if e.error), dropped[0])
    detail = f": {example.error}" if example.error else ""
    return f"env tags {tags}: {counts}; e.g. tag {example.task.tag!r} {example.end_reason}{detail}"


class FaultedSteps:
    """Counts the training steps in a row that env faults left without samples; :meth:`check` stops the run when
    they reach ``limit`` (0 or None: never). A step that trains, or that kept nothing for another reason (a group
    filter), ends the streak."""

    def __init__(self, limit: int | None, name: str, output_dir: str | Path | None = None) -> None:
        self.limit, self.name, self.output_dir = limit or 0, name, output_dir
        self.steps: list[int] = []
        self.episodes: list[EpisodeResult] = []

    def record(self, step: int, rollout: RolloutBatch) -> int:
        """Add ``step``'s rollout; returns how many steps in a row had nothing to train because of faults."""
        faulted = rollout.batch is None and any(e.end_reason in _DROPPING for e in rollout.episodes)
        if not faulted:
            self.steps, self.episodes = [], []
            return 0
        self.steps.append(step)
        self.episodes.extend(e for e in rollout.episodes if e.end_reason in _DROPPING)
        return len(self.steps)

    def state(self) -> list[int]:
        """The steps of the streak so far, for a checkpoint: a resumed run goes on counting from them (its error then
        lists the faulted episodes of its own steps)."""
        return list(self.steps)

    def load_state(self, steps: list[int]) -> None:
        self.steps, self.episodes = [int(step) for step in steps], []

    def check(self) -> None:
        """Raise :class:`RolloutFaultsError` once ``limit`` steps in a row had nothing to train."""
        if not self.limit or len(self.steps) < self.limit:
            return
        kept = f" in {self.output_dir}" if self.output_dir is not None else ""
        raise RolloutFaultsError(
            f"{self.name}: {len(self.steps)} steps in a row (steps {self.steps[0]}-{self.steps[-1]}) kept no sample "
            f"because of env faults ({describe_faults(self.episodes)}). Fix the env (or "
            f"raise its custom_envs.<tag>.step_timeout_s if it is only slow); {FIELD}={self.limit} is how many such "
            f"steps stop a run (0 or null: never). Metrics and checkpoints written so far are kept{kept}"
        )
