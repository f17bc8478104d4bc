"""Agentic rollout throughput: per-request generation (roll's env managers) vs lock-step batches, same run.

    ./tools/dev bench agentic_rollout                 # 64 envs x 2 episodes, 3 reps per mode
    ./tools/dev bench agentic_rollout --quick         # 16 envs, 1 rep
    ./tools/dev bench agentic_rollout --envs 128 --sigma 0.8 --env-step-ms 20

Workload: ``--envs`` FrozenLake envs each play ``--episodes`` episodes of up to ``--max-steps`` turns against a
mock policy (random actions, a few unparsable) whose engine latency is modelled per request: ``--overhead-ms`` +
lognormal per-token time (median ``--token-ms``, log-std ``--sigma``) x tokens. Each env step also costs a
lognormal ``--env-step-ms`` (a simulator or tool call), run off the event loop like any env call.

Modes, on identical episodes (same seeds, same per-request responses):

* ``per_request`` (the measured system): every env sends its turn as soon as its previous step is done, so one
  env's generation overlaps other envs' steps and nobody waits for the slowest request.
* ``lock_step`` (baseline): a barrier holds each turn's requests until every still-running episode has sent one,
  releases them as one batch and returns the answers together when the slowest is done; then all envs step.

Reported: wall time, env turns per second and generated tokens per second, and the per_request / lock_step
throughput ratio (median over ``--reps`` repetitions that alternate the modes and which goes first, after one
untimed small run of each). The last stdout line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from tools.bench._measure import environment
from tools.bench._report import add_report_arguments, emit_result, table

# roll.agentic (and torch through it) is imported inside the functions, so that --help answers at once
if TYPE_CHECKING:
    from roll.agentic.policy import GenerateRequest, GenerateResult, MockPolicyClient


class LockStepClient:
    """Holds requests until every active episode has sent one, then serves them as one batch."""

    def __init__(self, inner: MockPolicyClient, active: int) -> None:
        self.inner, self.active = inner, active
        self.pending: list[tuple[GenerateRequest, asyncio.Future[GenerateResult]]] = []
        self.batches: list[int] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        future: asyncio.Future[GenerateResult] = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        self._maybe_fire()
        return await future

    def episode_done(self) -> None:
        self.active -= 1
        self._maybe_fire()

    def _maybe_fire(self) -> None:
        if self.pending and len(self.pending) >= self.active:
            batch, self.pending = self.pending, []
            self.batches.append(len(batch))
            asyncio.get_running_loop().create_task(self._serve(batch))

    async def _serve(self, batch: list[tuple[GenerateRequest, asyncio.Future[GenerateResult]]]) -> None:
        results = await asyncio.gather(*(self.inner.generate(request) for request, _ in batch))
        for (_, future), result in zip(batch, results):  # the whole batch returns when its slowest request does
            future.set_result(result)


def run_mode(mode: str, args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    from roll.agentic.config import CustomEnvConfig
    from roll.agentic.env_manager import EpisodeTask
    from roll.agentic.policy import LatencyModel, MockPolicyClient, RandomActionPolicy
    from roll.agentic.pool import EnvPool, EnvSlot
    from roll.strategies import GenerationConfig
    from tools.bench import _slow_frozen_lake

    latency = LatencyModel(args.token_ms / 1e3, args.sigma, overhead_s=args.overhead_ms / 1e3)
    policy = RandomActionPolicy(["Up", "Down", "Left", "Right"], invalid_prob=0.1)
    mock = MockPolicyClient(tokenizer, policy, latency, seed=args.seed)
    client: Any = mock if mode == "per_request" else LockStepClient(mock, args.envs)
    spec = CustomEnvConfig(
        env_type=f"{_slow_frozen_lake.__name__}:SlowFrozenLake", env_config={"size": 4}, max_steps=args.max_steps
    )

    async def main() -> tuple[float, list[Any]]:
        pool = EnvPool(
            {"FL": spec},
            tokenizer,
            client,
            generation_config=GenerationConfig(max_new_tokens=32),
            sequence_length=8192,
        )
        pool.add_slots([EnvSlot(i, i, "FL") for i in range(args.envs)])

        async def env_loop(env_id: int) -> list[Any]:
            out = []
            for episode in range(args.episodes):
                seed = args.seed * 100_003 + env_id * 101 + episode
                ids = (f"FL_{env_id}_{episode}_{seed}", f"FL_{env_id}_{episode}_{seed}_{env_id}")
                out.append(await pool.run_episode(EpisodeTask(env_id, env_id, "FL", episode, seed, *ids)))
            if isinstance(client, LockStepClient):
                client.episode_done()
            return out

        start = time.perf_counter()
        results = await asyncio.gather(*(env_loop(i) for i in range(args.envs)))
        elapsed = time.perf_counter() - start
        pool.close()
        return elapsed, [r for env in results for r in env]

    elapsed, episodes = asyncio.run(main())
    turns = sum(e.num_turns for e in episodes)
    tokens = int(sum(e.metrics["generated_tokens"] for e in episodes))
    out = {"wall_s": elapsed, "turns": turns, "tokens": tokens, "episodes": len(episodes)}
    out.update(turns_per_s=turns / elapsed, tokens_per_s=tokens / elapsed, peak_in_flight=mock.stats.peak_in_flight)
    if isinstance(client, LockStepClient):
        out["mean_batch"] = statistics.fmean(client.batches)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=2, help="episodes per env (each env loops over them)")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--token-ms", type=float, default=2.0, help="median per-token decode time")
    parser.add_argument("--sigma", type=float, default=0.5, help="log-std of the per-request per-token time")
    parser.add_argument("--overhead-ms", type=float, default=5.0, help="fixed time per request")
    parser.add_argument("--env-step-ms", type=float, default=5.0, help="median env step time (lognormal)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 envs, 1 episode, 1 rep")
    add_report_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.envs, args.episodes, args.reps = 16, 1, 1
    from roll.strategies.testing import default_corpus, make_tokenizer
    from tools.bench import _slow_frozen_lake

    _slow_frozen_lake.ENV_STEP_MEDIAN_S = args.env_step_ms / 1e3
    tokenizer = make_tokenizer(default_corpus(0, 400) + ["<answer>Up</answer> <answer>Down</answer>"] * 50, 512)
    runs: dict[str, list[dict[str, Any]]] = {"per_request": [], "lock_step": []}
    warm_up = argparse.Namespace(**{**vars(args), "envs": 2, "episodes": 1})
    for mode in runs:  # untimed: the process's one-time costs (imports, first env builds) land on neither mode
        run_mode(mode, warm_up, tokenizer)
    for rep in range(args.reps):  # alternate, and swap which goes first, so both modes see the same machine load
        for mode in list(runs) if rep % 2 == 0 else list(runs)[::-1]:
            runs[mode].append(run_mode(mode, args, tokenizer))
    summary = {}
    for mode, reps in runs.items():
        summary[mode] = {key: statistics.median(r[key] for r in reps) for key in reps[0]}
    same_work = summary["per_request"]["turns"] == summary["lock_step"]["turns"]
    ratio = summary["per_request"]["turns_per_s"] / summary["lock_step"]["turns_per_s"]
    rows = [
        [mode, f"{s['wall_s']:.2f}", f"{s['turns_per_s']:.1f}", f"{s['tokens_per_s']:.0f}", int(s["turns"]),
         f"{s['turns_per_s'] / summary['lock_step']['turns_per_s']:.2f}x"]
        for mode, s in summary.items()
    ]  # fmt: skip
    print(f"{args.envs} envs x {args.episodes} episodes, engine latency {args.overhead_ms} ms + lognormal "
          f"{args.token_ms} ms/token (sigma {args.sigma}), env step {args.env_step_ms} ms; median of {args.reps} reps")  # fmt: skip
    print(table(rows, ["mode", "wall s", "turns/s", "tokens/s", "turns", "vs lock_step"]))
    if not same_work:
        print("warning: the two modes played different numbers of turns", file=sys.stderr)
    emit_result(
        {
            "bench": "agentic_rollout",
            "baseline": "lock_step",
            "throughput_ratio": ratio,
            "same_work": same_work,
            "per_request": summary["per_request"],
            "lock_step": summary["lock_step"],
            "args": {k: v for k, v in vars(args).items() if k != "result_file"},
            "env": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
