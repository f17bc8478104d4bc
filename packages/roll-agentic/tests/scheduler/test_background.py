"""Asynchronous rollouts (BackgroundRollouts + GatedPolicyClient), in-process with a mock policy: bounded staleness,
every trajectory used once, generation overlapping "training", and the synchronous case at ratio 0."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from collections import Counter

import pytest
import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env_manager import EpisodeResult
from roll.agentic.policy import (
    GatedPolicyClient,
    GenerateRequest,
    LatencyModel,
    MockPolicyClient,
    PauseTimeoutError,
    RandomActionPolicy,
)
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.scheduler.background import BackgroundRollouts
from roll.agentic.scheduler.faulted_steps import FaultedSteps, RolloutFaultsError
from roll.protocol import DataProto
from roll.strategies import GenerationConfig

ACTIONS = ["Up", "Down", "Left", "Right"]
ENVS = {"FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 4}, max_steps=3)}


def _rollouts(tokenizer, ratio: float, wrap=None) -> tuple[BackgroundRollouts, GatedPolicyClient]:
    """4 groups of 2 envs, batches of 2 groups; ``wrap`` the executor (before anything plays)."""
    config = EnvManagerConfig(num_env_groups=4, group_size=2, tags=["FL"])
    mock = MockPolicyClient(tokenizer, RandomActionPolicy(ACTIONS), LatencyModel(per_token_median_s=1e-4))
    gate = GatedPolicyClient(mock)
    scheduler = RolloutScheduler.local(
        config, ENVS, tokenizer, gate, generation_config=GenerationConfig(max_new_tokens=16), sequence_length=1024
    )
    if wrap is not None:
        scheduler.executor = wrap(scheduler.executor)
    return BackgroundRollouts(scheduler, batch_size=4, ratio=ratio), gate


def _wait_ready(background: BackgroundRollouts, groups: int) -> None:
    deadline = time.monotonic() + 120
    while background.accounting()["ready"] < groups:
        assert time.monotonic() < deadline, background.accounting()
        time.sleep(0.01)


def _sync(background: BackgroundRollouts, gate: GatedPolicyClient, step: int) -> None:
    """The pipeline's step boundary: pause generation, "copy weights", publish version ``step``, resume."""
    gate.pause_blocking(timeout_s=60)
    assert gate.in_flight == 0
    background.set_version(step)
    gate.resume(step)


@pytest.mark.parametrize("ratio", [1, 2])
def test_staleness_bounded_each_trajectory_used_once(tokenizer, ratio) -> None:
    background, gate = _rollouts(tokenizer, ratio)
    seen: set[str] = set()
    try:
        for step in range(1, 7):
            out = background.take(step, timeout_s=120)
            batch = out.batch
            assert batch is not None and len(batch) == 4
            versions = [int(v) for v in batch.non_tensor_batch["policy_version"]]
            # step k trains the policy of version k - 1; its trajectories are at most `ratio` versions older
            assert all(step - 1 - ratio <= v <= step - 1 for v in versions), (step, versions)
            assert out.metrics["async/batch_staleness_max"] == max(step - 1 - v for v in versions)
            assert out.metrics["async/staleness_max"] <= ratio
            traj_ids = set(batch.non_tensor_batch["traj_id"].tolist())
            assert len(traj_ids) == 4 and not traj_ids & seen  # never used twice
            seen |= traj_ids
            _wait_ready(background, 2)  # "training": generation goes on meanwhile, with the old weights
            _sync(background, gate, step)
            account = background.accounting()
            assert account["consumed"] == 2 * step
            assert (
                account["admitted"]
                == account["consumed"] + account["discarded"] + account["ready"] + account["generating"]
            )  # none lost
            assert account["admitted"] - account["discarded"] <= (step + 1 + ratio) * 2  # ran at most `ratio` ahead
    finally:
        background.close()
        background.scheduler.close()
    # generation overlapped training: from step 2 on, each batch was (at least partly) made before the last sync
    assert out.metrics["async/staleness_mean"] > 0


def test_ratio_0_trains_only_fresh_trajectories(tokenizer) -> None:
    background, gate = _rollouts(tokenizer, 0)
    try:
        for step in range(1, 4):
            batch = background.take(step, timeout_s=120).batch
            assert batch is not None
            assert {int(v) for v in batch.non_tensor_batch["policy_version"]} == {step - 1}
            _sync(background, gate, step)
    finally:
        background.close()
        background.scheduler.close()


def test_gate_waits_for_running_requests_and_stamps_the_new_version(tokenizer) -> None:
    import asyncio

    from roll.agentic.policy import GenerateRequest

    slow = MockPolicyClient(tokenizer, RandomActionPolicy(ACTIONS), LatencyModel(per_token_median_s=0.01))
    gate = GatedPolicyClient(slow)

    async def scenario() -> list[int]:
        request = GenerateRequest("r/0", [1, 2, 3], GenerationConfig(max_new_tokens=8))
        first = asyncio.ensure_future(gate.generate(request))
        await asyncio.sleep(0)  # started before the pause
        pausing = asyncio.ensure_future(gate.pause())
        await asyncio.sleep(0)
        second = asyncio.ensure_future(gate.generate(GenerateRequest("r/1", [1, 2], request.generation_config)))
        await pausing  # returns only once the first request is answered
        assert first.done() and not second.done()
        gate.resume(5)
        return [(await first).policy_version, (await second).policy_version]

    assert asyncio.run(scenario()) == [0, 5]


class _InOrder:
    """Wraps an executor so that episodes finish in the order they started (so rounds finish in launch order and
    timing does not pick which rounds a step takes); the rounds in ``faulty`` end with an env fault."""

    def __init__(self, inner, faulty: set[tuple[int, int]]) -> None:
        self.inner, self.faulty = inner, faulty
        self._last: asyncio.Future | None = None

    async def run(self, task):
        before, mine = self._last, asyncio.get_running_loop().create_future()
        self._last = mine
        try:
            result = await self.inner.run(task)
            if before is not None:
                await asyncio.shield(before)
        finally:
            if not mine.done():
                mine.set_result(None)
        if (task.group_id, task.episode_id) in self.faulty:
            return dataclasses.replace(result, end_reason="env_error", batch=None, error="injected")
        return result

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.inner.close()


class _DropEveryThird:
    """A group filter that drops rounds by their place alone (the same in every run)."""

    def filter(self, group_id: int, episode_id: int, episodes) -> bool:
        return (group_id + episode_id) % 3 == 2


def _ordered_rollouts(tokenizer, version: int = 0, state=None) -> tuple[BackgroundRollouts, GatedPolicyClient]:
    config = EnvManagerConfig(num_env_groups=3, group_size=2, tags=["FL"])
    mock = MockPolicyClient(tokenizer, RandomActionPolicy(ACTIONS), LatencyModel(per_token_median_s=1e-4))
    gate = GatedPolicyClient(mock, policy_version=version)
    scheduler = RolloutScheduler.local(
        config, ENVS, tokenizer, gate, generation_config=GenerationConfig(max_new_tokens=16), sequence_length=1024
    )
    scheduler.executor = _InOrder(scheduler.executor, faulty={(1, 2), (0, 4)})
    scheduler.group_filter = _DropEveryThird()
    if state is not None:
        scheduler.load_state(state)
    buffer_state = state.get("buffer") if state is not None else None  # as the pipeline's load_data_state keeps it
    return BackgroundRollouts(scheduler, batch_size=4, ratio=1, version=version, buffer_state=buffer_state), gate


def _settle(background: BackgroundRollouts) -> None:
    """Until generation has caught up: nothing running and no more rounds admitted (a long "training" step)."""
    deadline = time.monotonic() + 120
    limit = background.buffer.admit_limit(background.version - background.base)
    while True:
        account = background.accounting()
        if account["generating"] == 0 and account["admitted"] - account["discarded"] >= limit:
            return
        assert time.monotonic() < deadline, account
        time.sleep(0.01)


def _train(background: BackgroundRollouts, gate: GatedPolicyClient, steps: range, save_at: int = -1):
    """The pipeline's loop: take, "train" (generation catches up), sync; the rounds each step trained on, and
    the checkpoint state after step ``save_at``."""
    trained, saved = {}, None
    try:
        for step in steps:
            batch = background.take(step, timeout_s=120).batch
            trained[step] = list(dict.fromkeys(batch.non_tensor_batch["traj_group_id"].tolist()))
            _settle(background)
            _sync(background, gate, step)
            if step == save_at:
                _settle(background)  # rounds launched for the next steps are ready, not yet trained on
                saved = background.state()
    finally:
        background.close()
        background.scheduler.close()
    return trained, saved


def test_a_resumed_async_run_trains_on_the_rounds_an_uninterrupted_one_does(tokenizer) -> None:
    """The checkpoint after step 3 records the rounds played (or playing) but not trained on; the resumed run
    plays them again first, with the same seeds, so steps 4-6 train on the same rounds in the same order as an
    uninterrupted run, including the replacements of filtered and faulted rounds."""
    uninterrupted, _ = _train(*_ordered_rollouts(tokenizer), range(1, 7))
    before, saved = _train(*_ordered_rollouts(tokenizer), range(1, 4), save_at=3)
    assert saved is not None and before == {step: uninterrupted[step] for step in (1, 2, 3)}
    resumed, _ = _train(*_ordered_rollouts(tokenizer, version=3, state=saved), range(4, 7))
    assert resumed == {step: uninterrupted[step] for step in (4, 5, 6)}


def test_the_staleness_counters_continue_across_a_resume(tokenizer) -> None:
    """The checkpoint keeps the buffer's staleness histogram and stale-drop count under "buffer"; a resumed run's
    async/staleness_* metrics after step 6 count steps 1-6, the checkpoint's counts plus its own steps' (not steps
    4-6 alone). The replayed rounds are played again by the newer policy, so their staleness is the resumed run's."""
    first = _ordered_rollouts(tokenizer)
    _, saved = _train(*first, range(1, 4), save_at=3)
    assert saved is not None and saved["buffer"] == first[0].buffer.state_dict()
    before = Counter(saved["buffer"]["staleness_histogram"])
    assert sum(before.values()) == 3 * 4 and before[1] > 0  # 3 steps of 4 trajectories, some a step old
    fresh = _ordered_rollouts(tokenizer, version=3, state={k: v for k, v in saved.items() if k != "buffer"})
    _train(*fresh, range(4, 7))
    resumed = _ordered_rollouts(tokenizer, version=3, state=saved)
    _train(*resumed, range(4, 7))
    own, got = fresh[0].buffer, resumed[0].buffer
    assert got.staleness_histogram == before + own.staleness_histogram
    assert sum(got.staleness_histogram.values()) == 6 * 4
    assert got.stale_dropped == saved["buffer"]["stale_dropped"] + own.stale_dropped
    total = sum(k * v for k, v in (before + own.staleness_histogram).items())
    assert got.metrics()["async/staleness_mean"] == pytest.approx(total / 24)


class _Held:
    """Wraps an executor; the episodes of group ``held`` never finish (a round still playing at a checkpoint)."""

    def __init__(self, inner, held: int) -> None:
        self.inner, self.held = inner, held

    async def run(self, task):
        if task.group_id == self.held:
            await asyncio.Event().wait()
        return await self.inner.run(task)

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        self.inner.close()


def test_a_checkpoint_keeps_the_rounds_still_playing_and_those_ready(tokenizer) -> None:
    background, _ = _rollouts(tokenizer, 1, wrap=lambda inner: _Held(inner, held=3))  # 4 rounds before step 1
    scheduler = background.scheduler
    try:
        batch = background.take(1, timeout_s=120).batch
        trained = {tuple(int(x) for x in key.split("_")[1:3]) for key in batch.non_tensor_batch["traj_group_id"]}
        deadline = time.monotonic() + 120
        while background.accounting()["ready"] < 1:  # the 4th admitted round, played while step 1 "trains"
            assert time.monotonic() < deadline, background.accounting()
            time.sleep(0.01)
        saved = background.state()
    finally:
        background.close()
        scheduler.close()
    launched = {(group, episode) for group, count in enumerate(saved["next_episode"]) for episode in range(count)}
    replay = [tuple(pair) for pair in saved["replay"]]
    assert len(launched) == 4 and len(trained) == 2
    assert (3, 0) in replay and set(replay) == launched - trained  # none lost, none trained twice
    for group in range(4):  # a group's rounds in their order
        episodes = [episode for g, episode in replay if g == group]
        assert episodes == sorted(episodes)


def test_close_cancels_the_loops_pending_tasks(tokenizer, caplog) -> None:
    # A run stopped by SIGTERM closes the background loop while a policy client's serving task (ClusterPolicyClient's
    # batcher loops forever) still waits on it: closing must cancel it, not log asyncio's "Task was destroyed but it
    # is pending!" as an ERROR after a clean stop.
    background, _ = _rollouts(tokenizer, 1)

    async def serve_forever() -> None:
        await asyncio.Event().wait()

    started = asyncio.run_coroutine_threadsafe(_spawn(serve_forever), background.loop).result(timeout=30)
    try:
        background.take(1, timeout_s=120)
    finally:
        background.close()
        background.scheduler.close()
    gc.collect()
    assert started.cancelled() and background.loop.is_closed()
    assert not [r for r in caplog.records if r.name == "asyncio" and "destroyed" in r.getMessage()]


async def _spawn(make) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(make())


class _NeverAnswers:
    """A policy whose requests never finish (an engine busy with a long generation)."""

    async def generate(self, request):
        await asyncio.Event().wait()


def test_the_gates_pause_gives_up_after_its_timeout_with_the_requests_still_running() -> None:
    """The policy server awaits this pause: with a request that never finishes it raises PauseTimeoutError (how
    many, after how long, the caller's hint) instead of waiting forever; new requests stay held."""
    gate = GatedPolicyClient(_NeverAnswers())

    async def scenario() -> PauseTimeoutError:
        request = GenerateRequest("r/0", [1, 2], GenerationConfig(max_new_tokens=4))
        hung = asyncio.ensure_future(gate.generate(request))
        await asyncio.sleep(0.01)
        held = asyncio.ensure_future(gate.generate(GenerateRequest("r/1", [1], request.generation_config)))
        try:
            with pytest.raises(PauseTimeoutError) as caught:
                await gate.pause(timeout_s=0.05, hint="raise x.timeout_s")
            assert gate.in_flight == 1 and not held.done()  # the gate stayed closed
        finally:
            hung.cancel()
            held.cancel()
            await asyncio.gather(hung, held, return_exceptions=True)
        return caught.value

    error = asyncio.run(scenario())
    assert (error.running, error.timeout_s) == (1, 0.05)
    assert str(error) == (
        "1 generation request still running after waiting 0.05 s to pause generation for a weight sync (a hung "
        "inference engine?); raise x.timeout_s"
    )


class _OneEpisodeRaises:
    """Env slot 0's episode raises (as the Ray executor does when a worker's run_episode failed); every other
    episode waits on a generation request through ``gate``."""

    def __init__(self, gate: GatedPolicyClient) -> None:
        self.gate = gate

    async def run(self, task):
        if task.env_id == 0:
            await asyncio.sleep(0.05)
            raise RuntimeError("run_episode failed")
        request = GenerateRequest(f"r/{task.traj_id}", [1, 2], GenerationConfig(max_new_tokens=4))
        return await self.gate.generate(request)

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def test_an_episode_that_raises_leaves_no_generation_request_for_the_weight_sync_to_wait_on() -> None:
    """One episode of a round raises: the error reaches the trainer at take(), and the other episodes of that round
    are cancelled with it. Before, asyncio.gather left them parked on the stopped loop with their requests counted
    in flight, so the step's weight sync (which pauses the gate until none is) waited forever."""
    config = EnvManagerConfig(name="train_env", num_env_groups=2, group_size=2, tags=["FL"])
    gate = GatedPolicyClient(_NeverAnswers())
    scheduler = RolloutScheduler(config, _OneEpisodeRaises(gate), pad_token_id=0)
    background = BackgroundRollouts(scheduler, batch_size=4, ratio=1)
    try:
        with pytest.raises(RuntimeError, match="run_episode failed"):
            background.take(1, timeout_s=60)
        gate.pause_blocking(timeout_s=10)  # raised TimeoutError: 1 generation request still running
        assert gate.in_flight == 0
    finally:
        background.close()


class _OneRoundAtATime:
    """Rounds of one episode each, finishing one after another every ``delay`` seconds, every one kept."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._turn: asyncio.Lock | None = None
        self._sample("warm-up")  # the first DataProto imports its backends: not inside the timed wait

    @staticmethod
    def _sample(name: str) -> DataProto:
        tensors = {
            "prompts": torch.tensor([[1, 2]]),
            "responses": torch.tensor([[3, 4]]),
            "attention_mask": torch.ones(1, 4, dtype=torch.long),
            "response_mask": torch.ones(1, 2, dtype=torch.long),
            "rollout_log_probs": torch.zeros(1, 2),
            "scores": torch.zeros(1),
        }
        return DataProto.from_dict(tensors, {"traj_group_id": [name], "policy_version": [0]})

    async def run(self, task) -> EpisodeResult:
        self._turn = self._turn or asyncio.Lock()
        async with self._turn:
            await asyncio.sleep(self.delay)
        return EpisodeResult(task, "terminated", 1, True, 1.0, None, self._sample(task.traj_group_id))

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def test_take_times_out_after_take_timeout_s_even_while_rounds_trickle_in() -> None:
    """asynchrony.take_timeout_s bounds a step's whole wait. Before, each kept round woke the wait and restarted its
    timeout, so a step whose rounds came in one every 0.2 s never timed out at 0.5 s (it waited the 1.6 s its 8
    rounds took)."""
    config = EnvManagerConfig(name="train_env", num_env_groups=8, group_size=1, tags=["FL"])
    background = BackgroundRollouts(
        RolloutScheduler(config, _OneRoundAtATime(0.2), pad_token_id=0), batch_size=8, ratio=0
    )
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="step 1: no batch after 0.5 s"):
            background.take(1, timeout_s=0.5)
        assert time.monotonic() - started < 1.4
        assert len(background.take(1, timeout_s=60).batch) == 8  # the rounds go on arriving: a later take has them
    finally:
        background.close()


class _Rounds:
    """Rounds that end at once: every episode faulted (``fault``: its error) or one kept sample each. With
    ``recovers_at``, only the rounds before that one (by the group's round index) fault: the env service comes back
    at a fixed round, not when the test thread gets to change ``fault`` while the rollouts thread goes on playing."""

    def __init__(self, fault: str = "", recovers_at: int | None = None) -> None:
        self.fault, self.recovers_at = fault, recovers_at

    async def run(self, task) -> EpisodeResult:
        await asyncio.sleep(0.001)
        if self.fault and (self.recovers_at is None or task.episode_id < self.recovers_at):
            return EpisodeResult.unplayed(task, "env_error", self.fault)
        return EpisodeResult(task, "terminated", 1, True, 1.0, None, _OneRoundAtATime._sample(task.traj_group_id))

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class _DropAll:
    def filter(self, group_id: int, episode_id: int, episodes) -> bool:
        return True


def _one_group(executor, group_filter=None) -> BackgroundRollouts:
    """One group of 2 envs, batches of one group: a step's launch budget is max_launch_factor (4) rounds, played
    one after another (so which rounds a step saw does not depend on timing)."""
    config = EnvManagerConfig(name="train_env", num_env_groups=1, group_size=2, tags=["Down"])
    scheduler = RolloutScheduler(config, executor, pad_token_id=0)
    if group_filter is not None:
        scheduler.group_filter = group_filter
    return BackgroundRollouts(scheduler, batch_size=2, ratio=1)


def test_a_broken_env_makes_steps_with_nothing_to_train_that_max_faulted_steps_counts() -> None:
    """An env that faults every round: once a step's launch budget (groups x max_launch_factor rounds) is dropped
    in a row, take() returns that step with no batch and its faulted episodes, as the synchronous scheduler does, so
    rollout.max_faulted_steps stops the run after that many such steps (0 or null: never). Before, the background
    rollouts raised RolloutsStalledError at the first such step, whatever rollout.max_faulted_steps said."""
    background = _one_group(_Rounds("reset() raised ConnectionError: env service is down"))
    stops, never, off = FaultedSteps(2, "train_env"), FaultedSteps(0, "train_env"), FaultedSteps(None, "train_env")
    try:
        for step in (1, 2, 3):
            rollout = background.take(step, timeout_s=60)
            assert rollout.batch is None
            assert rollout.metrics["rollout/groups_faulted"] == 4 and len(rollout.episodes) == 8
            assert all(e.end_reason == "env_error" for e in rollout.episodes)
            for tracker in (stops, never, off):
                assert tracker.record(step, rollout) == step
            never.check()
            off.check()
            if step == 1:
                stops.check()  # one faulted step: the run goes on
    finally:
        background.close()
    with pytest.raises(RolloutFaultsError) as caught:
        stops.check()
    assert str(caught.value).startswith(
        "train_env: 3 steps in a row (steps 1-3) kept no sample because of env faults (env tags ['Down']: env_error "
        "x24; e.g. tag 'Down' env_error: reset() raised ConnectionError: env service is down). "
    )
    assert "rollout.max_faulted_steps=2 is how many such steps stop a run (0 or null: never)" in str(caught.value)


def test_a_filter_that_drops_every_round_skips_steps_without_counting_them_as_faulted() -> None:
    """A group filter that drops every round is no fault: each step's launch budget ends with no batch (the step
    trains on nothing, as a synchronous one), and the faulted-steps streak stays 0. Before, the background rollouts
    raised RolloutsStalledError after one step's budget of filtered rounds."""
    background = _one_group(_Rounds(), _DropAll())
    steps = FaultedSteps(1, "train_env")
    try:
        for step in (1, 2):
            rollout = background.take(step, timeout_s=60)
            assert rollout.batch is None and rollout.metrics["rollout/groups_filtered"] == 4
            assert steps.record(step, rollout) == 0
            steps.check()
    finally:
        background.close()


def test_a_step_trains_again_once_the_env_recovers() -> None:
    """After a step whose budget was all faulted, the next one launches rounds again and trains on them. The env
    recovers at round 4, right after step 1's budget (rounds 0-3): clearing the fault from the test after take(1)
    raced the rollouts thread, which could fault step 2's budget too first (a test thread held up 50 ms did)."""
    background = _one_group(_Rounds("env_error", recovers_at=4))
    try:
        assert background.take(1, timeout_s=60).batch is None
        rollout = background.take(2, timeout_s=60)
        assert rollout.batch is not None and len(rollout.batch) == 2
        assert FaultedSteps(1, "train_env").record(2, rollout) == 0
    finally:
        background.close()


def test_a_step_that_took_nothing_does_not_let_more_groups_be_admitted_ahead() -> None:
    """Admission lets a version be ``ratio`` steps ahead of training, counting one step's groups consumed per version.
    A step that took nothing still moves the version on at its weight sync: before, the next steps admitted one step's
    groups more than training would use in time, and those went stale unused (dropped after being played)."""
    # the env recovers after step 1's budget (rounds 0-3), whenever this thread runs (see the test above)
    background = _one_group(_Rounds("env_error", recovers_at=4))  # one group a step, ratio 1: two groups ahead at most
    try:
        assert background.take(1, timeout_s=60).batch is None
        background.set_version(1)  # the pipeline's weight sync after the empty step
        deadline = time.monotonic() + 60
        while not ((a := background.accounting())["ready"] >= 2 and a["generating"] == 0):
            assert time.monotonic() < deadline, a
            time.sleep(0.01)
        time.sleep(0.3)  # the producer would launch a third group now, if admission let it
        assert background.accounting()["ready"] == 2
        rollout = background.take(2, timeout_s=60)
        assert rollout.batch is not None and rollout.metrics["async/stale_dropped"] == 0
    finally:
        background.close()
