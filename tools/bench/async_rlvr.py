"""Async RLVR vs synchronous, in a latency-modelled simulation (no model, no Ray: simulated time).

The model::

    N inference workers x S slots     continuous batching: a request's time does not depend on the others
    request time ~ lognormal          median --median-s, p99/p50 = --tail (10: long reasoning tails)
    a step = G groups x n samples     a group is ready when its n samples are
    train step: --train-s             weight sync: --sync-s (engines paused for the copy)

* ``sync``: generate the step's G*n requests, wait for the last one, train, sync (ROLL's default).
* ``async rR``: generation never stops; admission and staleness follow roll's real
  :class:`roll.pipelines.rlvr.replay.ReplayBuffer` (``async_generation_ratio = R``). With partial rollouts the
  requests in flight at a weight sync are aborted and resumed afterwards under the new weights (plus a re-prefill
  cost); without them the sync must first wait for every request in flight to finish (``drain``).

Prints samples/s per mode (mean over seeds), the speedup of each over sync, the staleness histogram of the trained
samples (asserted never above the bound), then ``RESULT {json}`` whose ``speedup`` is async ratio 1 (partial
rollouts) over sync.

    python -m tools.bench.async_rlvr [--steps 40] [--seeds 3] [--result-file PATH]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tools.bench._report import add_report_arguments, emit_result, table

_Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True)
class Setup:
    workers: int = 4
    slots: int = 16
    groups: int = 16
    n: int = 8
    median_s: float = 1.0
    tail: float = 10.0
    train_s: float = 6.0
    sync_s: float = 0.5
    resume_s: float = 0.05  # re-prefill of an aborted request's prefix

    @property
    def sigma(self) -> float:
        return math.log(self.tail) / _Z99


@dataclass
class Outcome:
    seconds: float
    samples: int
    staleness: Counter[int] = field(default_factory=Counter)
    stale_dropped: int = 0
    aborted: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds


def request_times(setup: Setup, rng: random.Random, count: int) -> list[float]:
    return [setup.median_s * math.exp(setup.sigma * rng.gauss(0.0, 1.0)) for _ in range(count)]


def run_sync(setup: Setup, steps: int, seed: int) -> Outcome:
    """Generate a whole batch (greedy list scheduling onto slots), train, sync; repeat."""
    rng = random.Random(seed)
    clock = 0.0
    slots = setup.workers * setup.slots
    for _ in range(steps):
        free = [clock] * slots
        for duration in request_times(setup, rng, setup.groups * setup.n):
            start = heapq.heappop(free)
            heapq.heappush(free, start + duration)
        clock = max(free) + setup.train_s + setup.sync_s
    return Outcome(clock, steps * setup.groups * setup.n, Counter({0: steps * setup.groups * setup.n}))


@dataclass
class _Request:
    group: int
    remaining: float
    version: int  # the oldest weights that produced any of its tokens
    resumed: bool = False


class _AsyncSim:
    """Event loop of one async run: engines, the replay buffer, and a trainer that syncs after each step."""

    def __init__(self, setup: Setup, ratio: int, partial: bool, seed: int) -> None:
        from roll.pipelines.rlvr.replay import ReplayBuffer  # here, not at the top: --help answers without torch

        self.setup, self.partial = setup, partial
        self.rng = random.Random(seed)
        self.buffer: ReplayBuffer[None] = ReplayBuffer(setup.groups, ratio)
        self.clock = 0.0
        self.version = 0
        self.queue: list[_Request] = []
        self.running: dict[int, tuple[float, _Request]] = {}  # id -> (finish time, request)
        self.free_slots = setup.workers * setup.slots
        self.pending: dict[int, list[int]] = {}  # group -> [unfinished samples, oldest version]
        self.paused = False
        self.aborted = 0
        self._ids = 0

    def admit(self) -> None:
        while self.buffer.may_admit(self.version):
            group = self.buffer.admitted
            self.buffer.admit()
            self.pending[group] = [self.setup.n, self.version]
            for duration in request_times(self.setup, self.rng, self.setup.n):
                self.queue.append(_Request(group, duration, self.version))

    def start_requests(self) -> None:
        while not self.paused and self.free_slots and self.queue:
            request = self.queue.pop(0)
            if not request.resumed:  # a fresh request runs on the current weights
                request.version = self.version
            self.free_slots -= 1
            self._ids += 1
            self.running[self._ids] = (self.clock + request.remaining, request)

    def advance_to(self, until: float) -> None:
        """Finish every running request due before ``until`` (starting queued ones in freed slots)."""
        from roll.pipelines.rlvr.replay import FinishedGroup

        while True:
            self.start_requests()
            due = min(self.running.items(), key=lambda kv: kv[1][0], default=None)
            if due is None or due[1][0] > until:
                break
            rid, (finish, request) = due
            self.clock = finish
            del self.running[rid]
            self.free_slots += 1
            state = self.pending[request.group]
            state[0] -= 1
            state[1] = min(state[1], request.version)
            if state[0] == 0:
                del self.pending[request.group]
                self.buffer.put(FinishedGroup(request.group, state[1], None, self.setup.n))
                self.admit()
        self.clock = max(self.clock, until)

    def next_finish(self) -> float:
        self.start_requests()
        return min((finish for finish, _ in self.running.values()), default=math.inf)

    def weight_sync(self) -> None:
        if self.partial:  # abort in-flight requests; they resume after the copy with their prefix kept
            for finish, request in self.running.values():
                request.remaining = max(0.0, finish - self.clock) + self.setup.resume_s
                request.resumed = True  # keeps the version its first tokens came from
                self.queue.insert(0, request)
            self.aborted += len(self.running)
            self.free_slots += len(self.running)
            self.running.clear()
        else:  # drain: no new request starts until everything in flight has finished
            self.paused = True
            while self.running:
                self.advance_to(self.next_finish())
        self.paused = True
        self.clock += self.setup.sync_s
        self.version += 1
        self.paused = False
        self.admit()

    def run(self, steps: int) -> Outcome:
        self.admit()
        for step in range(1, steps + 1):
            while (batch := self.buffer.take(step - 1)) is None:
                self.advance_to(self.next_finish())
            self.advance_to(self.clock + self.setup.train_s)  # generation continues while the trainer trains
            self.weight_sync()
            del batch
        trained = self.buffer.consumed * self.setup.n
        return Outcome(self.clock, trained, Counter(self.buffer.staleness_histogram), self.buffer.stale_dropped,
                       self.aborted)  # fmt: skip


def run_async(setup: Setup, steps: int, seed: int, ratio: int, partial: bool = True) -> Outcome:
    outcome = _AsyncSim(setup, ratio, partial, seed).run(steps)
    assert max(outcome.staleness) <= ratio, f"staleness {max(outcome.staleness)} above the bound {ratio}"
    return outcome


def compare(setup: Setup, steps: int, seeds: int) -> dict[str, dict[str, Any]]:
    modes = {
        "sync": lambda s: run_sync(setup, steps, s),
        "async r1": lambda s: run_async(setup, steps, s, 1),
        "async r2": lambda s: run_async(setup, steps, s, 2),
        "async r1 drain": lambda s: run_async(setup, steps, s, 1, partial=False),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, fn in modes.items():
        runs = [fn(1000 + i) for i in range(seeds)]
        histogram: Counter[int] = Counter()
        for run in runs:
            histogram.update(run.staleness)
        out[name] = {
            "samples_per_s": sum(r.samples_per_s for r in runs) / len(runs),
            "staleness": dict(sorted(histogram.items())),
            "stale_dropped": sum(r.stale_dropped for r in runs),
            "aborted": sum(r.aborted for r in runs),
        }
    base = out["sync"]["samples_per_s"]
    for entry in out.values():
        entry["speedup"] = entry["samples_per_s"] / base
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Setup()
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    add_report_arguments(parser)
    args = parser.parse_args(argv)
    setup = Setup(**{k: getattr(args, k) for k in vars(defaults)})
    results = compare(setup, args.steps, args.seeds)
    print(f"setup: {setup} (sigma={setup.sigma:.3f}), {args.steps} steps, {args.seeds} seeds")
    rows = [
        (name, f"{r['samples_per_s']:.2f}", f"{r['speedup']:.2f}x", r["staleness"], r["stale_dropped"], r["aborted"])
        for name, r in results.items()
    ]
    print(table(rows, ["mode", "samples/s", "vs sync", "staleness histogram", "stale dropped", "aborted"]))
    emit_result(
        {
            "benchmark": "async_rlvr",
            "speedup": results["async r1"]["speedup"],
            "speedup_ratio2": results["async r2"]["speedup"],
            "speedup_ratio1_drain": results["async r1 drain"]["speedup"],
            "modes": results,
            "setup": vars(setup),
            "steps": args.steps,
            "seeds": args.seeds,
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
