"""Redundant episodes per group (``group_size_redundancy``): trajectories per second against none, same run.

    ./tools/dev bench group_redundancy                      # 8 groups x 4, redundancy 0 / 1 / 2, 3 reps
    ./tools/dev bench group_redundancy --quick              # 4 groups, 2 batches, 1 rep
    ./tools/dev bench group_redundancy --engine-slots 32    # an engine that serves 32 requests at once

Workload: ``--groups`` FrozenLake groups of ``--group-size`` envs play ``--batches`` training batches (every group
once per batch) through the in-process RolloutScheduler, against a mock policy (random actions, a few unparsable)
whose engine latency per request is ``--overhead-ms`` + lognormal per-token time (median ``--token-ms``, log-std
``--sigma``: the straggler tail) x tokens. A round ends when its kept episodes have finished, so its wall time is its
slowest kept episode's.

Modes: redundancy 0 (the baseline: every round waits for all ``group_size`` episodes) and each ``--redundancy``
value R (the round plays ``group_size + R`` episodes on its seed, keeps the first ``group_size`` to finish and
cancels the rest). The mock engine serves any number of requests at once unless ``--engine-slots`` caps it: without a
cap the redundant episodes cost nothing but the waiting they save, which overstates the gain of a real engine whose
batch slots they take. Reported per mode: wall time, kept trajectories per second and its ratio to the baseline,
engine requests per kept trajectory (the cost), and the kept episodes' mean number of turns beside the baseline's
(the lean toward quicker episodes). Medians over ``--reps`` repetitions that alternate the modes' order, after one
untimed small run of each. The last stdout line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from tools.bench._measure import environment
from tools.bench._report import add_report_arguments, emit_result, table


class _CappedClient:
    """A policy client that serves at most ``slots`` requests at once (the rest queue), like an engine's batch."""

    def __init__(self, inner: Any, slots: int) -> None:
        self.inner, self.slots = inner, slots
        self.requests = 0
        self._semaphore: asyncio.Semaphore | None = None

    async def generate(self, request: Any) -> Any:
        self.requests += 1
        if self.slots <= 0:
            return await self.inner.generate(request)
        if self._semaphore is None:  # made on the loop that uses it
            self._semaphore = asyncio.Semaphore(self.slots)
        async with self._semaphore:
            return await self.inner.generate(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_mode(redundancy: int, args: argparse.Namespace, tokenizer: Any) -> dict[str, float]:
    from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
    from roll.agentic.policy import LatencyModel, MockPolicyClient, RandomActionPolicy
    from roll.agentic.scheduler import RolloutScheduler
    from roll.strategies import GenerationConfig

    latency = LatencyModel(args.token_ms / 1e3, args.sigma, overhead_s=args.overhead_ms / 1e3)
    policy = RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.1)
    client = _CappedClient(MockPolicyClient(tokenizer, policy, latency, seed=args.seed), args.engine_slots)
    config = EnvManagerConfig(
        name="train_env",
        num_env_groups=args.groups,
        group_size=args.group_size,
        group_size_redundancy=redundancy,
        tags=["FL"],
    )
    envs = {"FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 4}, max_steps=args.max_steps)}
    scheduler = RolloutScheduler.local(
        config,
        envs,
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=32),
        sequence_length=8192,
        seed=args.seed,
    )
    batch = args.groups * args.group_size
    kept_turns: list[int] = []
    try:
        start = time.perf_counter()
        for _ in range(args.batches):
            out = scheduler.get_batch(batch)
            kept_turns += [e.num_turns for e in out.episodes if e.batch is not None]
        elapsed = time.perf_counter() - start
    finally:
        scheduler.close()
    kept = len(kept_turns)
    return {
        "wall_s": elapsed,
        "kept": kept,
        "kept_per_s": kept / elapsed,
        "requests_per_kept": client.requests / kept,
        "mean_kept_turns": statistics.fmean(kept_turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--redundancy", type=int, nargs="+", default=[1, 2], help="values compared with 0")
    parser.add_argument("--batches", type=int, default=4, help="training batches per mode and rep")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--token-ms", type=float, default=2.0, help="median per-token decode time")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-std of the per-request per-token time")
    parser.add_argument("--overhead-ms", type=float, default=5.0, help="fixed time per request")
    parser.add_argument("--engine-slots", type=int, default=0, help="requests served at once (0: no cap)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 groups, 2 batches, 1 rep")
    add_report_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.groups, args.batches, args.reps = 4, 2, 1
    from roll.strategies.testing import default_corpus, make_tokenizer

    tokenizer = make_tokenizer(default_corpus(0, 400) + ["<answer>Up</answer> <answer>Down</answer>"] * 50, 512)
    modes = [0, *args.redundancy]
    warm_up = argparse.Namespace(**{**vars(args), "groups": 1, "batches": 1})
    for redundancy in modes:  # untimed: one-time costs (imports, first env builds) land on no mode
        run_mode(redundancy, warm_up, tokenizer)
    runs: dict[int, list[dict[str, float]]] = {r: [] for r in modes}
    for rep in range(args.reps):  # alternate the order, so that every mode sees the same machine load
        for redundancy in modes if rep % 2 == 0 else modes[::-1]:
            runs[redundancy].append(run_mode(redundancy, args, tokenizer))
    summary = {r: {key: statistics.median(run[key] for run in reps) for key in reps[0]} for r, reps in runs.items()}
    base = summary[0]
    rows = [
        [r, f"{s['wall_s']:.2f}", int(s["kept"]), f"{s['kept_per_s']:.1f}", f"{s['kept_per_s'] / base['kept_per_s']:.2f}x",
         f"{s['requests_per_kept']:.2f}", f"{s['mean_kept_turns']:.2f}"]
        for r, s in summary.items()
    ]  # fmt: skip
    cap = args.engine_slots or "no cap"
    print(f"{args.groups} groups x {args.group_size}, {args.batches} batches; engine latency {args.overhead_ms} ms + "
          f"lognormal {args.token_ms} ms/token (sigma {args.sigma}), engine slots: {cap}; median of {args.reps} reps")  # fmt: skip
    print(table(rows, ["redundancy", "wall s", "kept", "kept/s", "vs 0", "requests/kept", "turns/kept"]))
    emit_result(
        {
            "bench": "group_redundancy",
            "baseline": "redundancy 0",
            "throughput_ratio": {str(r): s["kept_per_s"] / base["kept_per_s"] for r, s in summary.items() if r},
            "modes": {str(r): s for r, s in summary.items()},
            "args": {k: v for k, v in vars(args).items() if k != "result_file"},
            "env": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
