"""RolloutScheduler (in-process): whole groups sharing seeds, filters with replacements, faults, validation."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch

from roll.agentic.config import CustomEnvConfig, EnvManagerConfig
from roll.agentic.env_manager import EpisodeResult, EpisodeTask
from roll.agentic.policy import LatencyModel, MockPolicyClient, RandomActionPolicy
from roll.agentic.scheduler import RolloutScheduler
from roll.agentic.scheduler.filters import GroupFilter
from roll.agentic.scheduler.plan import episode_seed
from roll.protocol import DataProto
from roll.runtime import ConfigError
from roll.strategies import GenerationConfig

ACTIONS = ["Up", "Down", "Left", "Right"]
ENVS = {
    "FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 4, "format_penalty": -0.1}, max_steps=4),
    "SK": CustomEnvConfig(env_type="sokoban", env_config={"dim_room": [6, 6]}, max_steps=4),
    "FLstep": CustomEnvConfig(env_type="frozen_lake", max_steps=3, env_manager_cls="step"),
}


def make(tokenizer, mode="train", envs=None, seed=0, invalid_prob=0.2, **config) -> RolloutScheduler:
    config = EnvManagerConfig(**{"num_env_groups": 4, "group_size": 3, "tags": ["FL", "SK"], **config})
    policy = RandomActionPolicy(ACTIONS, invalid_prob=invalid_prob)
    client = MockPolicyClient(tokenizer, policy, LatencyModel(per_token_median_s=1e-4, per_token_sigma=1.0))
    return RolloutScheduler.local(
        config,
        envs or ENVS,
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=32),
        sequence_length=2048,
        mode=mode,
        seed=seed,
    )


def _first_prompts(batch) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for group, prompt in zip(batch.non_tensor_batch["traj_group_id"], batch.batch["prompts"]):
        out.setdefault(group, set()).add(str(prompt.tolist()))
    return out


def test_batch_of_whole_groups_with_shared_seeds(tokenizer) -> None:
    scheduler = make(tokenizer)
    out = scheduler.get_batch(18)  # 6 groups of 3: two slots run a second round
    batch = out.batch
    assert len(batch) == 18 and len(out.episodes) == 18
    per_group = Counter(batch.non_tensor_batch["traj_group_id"].tolist())
    assert len(per_group) == 6 and set(per_group.values()) == {3}
    assert len(set(batch.non_tensor_batch["traj_id"].tolist())) == 18
    # All members of a round started from the same state: identical first prompts; rounds differ.
    prompts = _first_prompts(batch)
    assert all(len(p) == 1 for p in prompts.values()) and len({next(iter(p)) for p in prompts.values()}) == 6
    assert out.metrics["rollout/groups_kept"] == 6 and out.metrics["rollout/episodes"] == 18
    assert {"rollout/success", "rollout/format", "rollout/FL/success", "rollout/SK/format"} <= set(out.metrics)
    # Rows come in launch order (the first round of groups 0..3 first), whatever order the rounds finished in.
    assert batch.non_tensor_batch["group_id"].tolist()[:12] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    tags = Counter(batch.non_tensor_batch["tag"].tolist())
    assert tags["FL"] + tags["SK"] == 18 and tags["FL"] % 3 == 0
    scheduler.close()


def test_train_rounds_advance_and_validation_repeats(tokenizer) -> None:
    train = make(tokenizer)
    first = set(train.get_batch(12).batch.non_tensor_batch["traj_group_id"].tolist())
    second = set(train.get_batch(12).batch.non_tensor_batch["traj_group_id"].tolist())
    assert first.isdisjoint(second)
    val = make(tokenizer, mode="val", invalid_prob=0.0)
    a, b = val.get_batch(), val.get_batch()
    assert len(a.batch) == 12 and a.metrics["val/groups_kept"] == 4
    key = "traj_id"
    order_a = sorted(zip(a.batch.non_tensor_batch[key].tolist(), a.batch.batch["input_ids"].tolist()))
    order_b = sorted(zip(b.batch.non_tensor_batch[key].tolist(), b.batch.batch["input_ids"].tolist()))
    assert order_a == order_b  # same seeds, same (deterministic) policy: the same episodes
    train.close()
    val.close()


def test_filter_drops_groups_and_replaces_them(tokenizer) -> None:
    scheduler = make(tokenizer, group_filter_cls="roll.agentic.scheduler.filters.ZeroVarianceGroupFilter")
    out = scheduler.get_batch(12)
    m = out.metrics
    assert m["rollout/groups_kept"] == 4
    assert m["rollout/groups_launched"] == m["rollout/groups_kept"] + m["rollout/groups_filtered"]
    assert m["rollout/groups_filtered"] >= 1  # random play often scores a group the same
    scores: dict[str, list[float]] = {}
    for group, score in zip(out.batch.non_tensor_batch["traj_group_id"], out.batch.batch["scores"].tolist()):
        scores.setdefault(group, []).append(score)
    assert all(max(s) - min(s) > 1e-6 for s in scores.values())
    assert len(out.episodes) == 3 * m["rollout/groups_launched"]
    scheduler.close()


def test_step_wise_manager_counts_trajectories(tokenizer) -> None:
    scheduler = make(tokenizer, tags=["FLstep"], num_env_groups=2, group_size=2)
    out = scheduler.get_batch(4)
    episodes = {e.task.traj_id: e.num_turns for e in out.episodes}
    assert len(episodes) == 4 and len(out.batch) == sum(episodes.values())
    assert "state_hash" in out.batch.non_tensor_batch and "step" in out.batch.non_tensor_batch
    scheduler.close()


def test_max_traj_per_env_and_bad_sizes(tokenizer) -> None:
    scheduler = make(tokenizer, max_traj_per_env=1)
    with pytest.raises(ConfigError, match="max_traj_per_env=1"):
        scheduler.get_batch(15)
    with pytest.raises(ConfigError, match="multiple of train_env.group_size=3"):
        scheduler.get_batch(10)
    assert len(scheduler.get_batch(12).batch) == 12
    scheduler.close()


def test_config_errors_name_the_tags(tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"tags \['Nope'\] are not defined"):
        make(tokenizer, tags=["Nope"])
    with pytest.raises(ConfigError, match="mix env managers"):
        make(tokenizer, tags=["FL", "FLstep"])


def test_close_cancels_tasks_left_on_the_schedulers_loop(tokenizer) -> None:
    """A client may park a task on the scheduler's loop (ClusterPolicyClient's batching server); close ends it."""
    import asyncio

    scheduler = make(tokenizer)
    scheduler.get_batch(3)
    loop = scheduler._loop
    assert loop is not None
    parked = loop.create_task(asyncio.Event().wait())
    scheduler.close()
    assert parked.cancelled() and loop.is_closed()


class _TimedExecutor:
    """Finishes each episode after ``delay(task)`` seconds, playing nothing (the scheduler's bookkeeping alone)."""

    def __init__(self, delay) -> None:
        self.delay = delay

    async def run(self, task) -> EpisodeResult:
        await asyncio.sleep(self.delay(task))
        return EpisodeResult(task, "terminated", 1, True, 1.0, None, None)

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def _rounds(out) -> list[tuple[int, int, int]]:
    return sorted({(e.task.group_id, e.task.episode_id, e.task.seed) for e in out.episodes})


def test_validation_plays_the_same_rounds_whatever_the_timing() -> None:
    """Every validation plays a fixed plan (all groups' episode 0 in order, then episode 1, ...), not the rounds
    of whichever group finishes first, and not where the last validation's round-robin stopped."""
    config = EnvManagerConfig(name="val_env", num_env_groups=4, group_size=2, tags=["FL"])
    fast_first = RolloutScheduler(
        config, _TimedExecutor(lambda t: 0.001 * (t.group_id + 1)), pad_token_id=0, mode="val"
    )
    fast_last = RolloutScheduler(config, _TimedExecutor(lambda t: 0.001 * (4 - t.group_id)), pad_token_id=0, mode="val")
    half = [_rounds(fast_first.get_batch(4)) for _ in range(3)]
    assert half[0] == half[1] == half[2] and [g for g, _, _ in half[0]] == [0, 1]
    more = _rounds(fast_first.get_batch(12))  # one and a half rounds of every group
    assert more == _rounds(fast_last.get_batch(12))
    assert [(g, e) for g, e, _ in more] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0)]


class _SampleExecutor(_TimedExecutor):
    """Like _TimedExecutor, but every episode has a one-row sample (its traj_group_id), so its round is kept unless
    the group filter drops it."""

    async def run(self, task) -> EpisodeResult:
        await asyncio.sleep(self.delay(task))
        tensors = {
            "prompts": torch.tensor([[1, 2]]),
            "responses": torch.tensor([[3, 4]]),
            "attention_mask": torch.ones(1, 4, dtype=torch.long),
            "response_mask": torch.ones(1, 2, dtype=torch.long),
            "rollout_log_probs": torch.zeros(1, 2),
            "scores": torch.zeros(1),
        }
        batch = DataProto.from_dict(tensors, {"traj_group_id": [f"{task.group_id}_{task.episode_id}"]})
        return EpisodeResult(task, "terminated", 1, True, 1.0, None, batch)


class DropEvenRounds(GroupFilter):
    """A group filter dropping the rounds whose group and episode ids add up to an even number."""

    def filter(self, group_id: int, episode_id: int, episodes) -> bool:
        return (group_id + episode_id) % 2 == 0


def test_dropped_rounds_are_replaced_the_same_way_whatever_the_timing() -> None:
    """A dropped round is replaced by its own group's next episode, so the rounds played and the batch's order are
    the same whichever group finishes first (before, a replacement went to the next free group by the round-robin
    cursor: group 1's second round when group 1 had finished before group 2 was dropped)."""
    config = EnvManagerConfig(
        name="train_env", num_env_groups=4, group_size=1, tags=["FL"], group_filter_cls=f"{__name__}.DropEvenRounds"
    )
    finish_order = {"by_group": [0, 1, 2, 3], "one_first": [2, 0, 1, 3], "last_first": [3, 2, 1, 0]}
    runs = {}
    for name, ranks in finish_order.items():
        executor = _SampleExecutor(lambda t, ranks=ranks: 0.002 * (ranks[t.group_id] + 1) + 0.01 * t.episode_id)
        scheduler = RolloutScheduler(config, executor, pad_token_id=0)
        batches = [scheduler.get_batch(4) for _ in range(2)]
        played = [sorted((e.task.group_id, e.task.episode_id) for e in out.episodes) for out in batches]
        runs[name] = played, [list(out.batch.non_tensor_batch["traj_group_id"]) for out in batches], scheduler.state()
    assert runs["by_group"] == runs["one_first"] == runs["last_first"]
    played, order, state = runs["by_group"]
    # groups 0 and 2 drop episode 0 and keep episode 1; 1 and 3 keep episode 0; the next call goes on from there
    assert played[0] == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (3, 0)]
    assert order[0] == ["0_1", "1_0", "2_1", "3_0"]  # in the places of the rounds they replace
    assert order[1] == ["0_3", "1_2", "2_3", "3_2"] and state == {"next_episode": [4, 3, 4, 3], "cursor": 0}


class _StragglerExecutor(_SampleExecutor):
    """Env slot ``slow`` of every group takes a second, slot ``faulty`` ends its episodes with an env fault; the
    others finish in a few milliseconds, in slot order."""

    def __init__(self, slow: int | None = None, faulty: int | None = None) -> None:
        super().__init__(lambda t: 1.0 if t.env_id % 3 == slow else 0.001 * (t.env_id % 3 + 1))
        self.faulty, self.started, self.cancelled = faulty, [], []
        # the first sample built in a process takes a second (torch's set-up) on the loop, which would let every
        # timer of the round expire at once: build one before
        asyncio.run(_SampleExecutor(lambda t: 0).run(EpisodeTask(0, 0, "FL", 0, 0, "warm", "warm_0")))

    async def run(self, task) -> EpisodeResult:
        self.started.append(task.env_id)
        try:
            result = await super().run(task)
        except asyncio.CancelledError:
            self.cancelled.append(task.env_id)
            raise
        if task.env_id % 3 == self.faulty:
            return EpisodeResult(task, "env_error", 0, False, 0.0, None, None, error="boom")
        return result


def test_redundant_episodes_let_a_round_end_without_its_straggler_or_its_faulted_episode() -> None:
    """``group_size_redundancy`` (ROLL's): each group has group_size + redundancy envs on the round's seed; the
    first group_size episodes to finish without a fault are kept, the others cancelled (counted)."""
    config = EnvManagerConfig(name="train_env", num_env_groups=2, group_size=2, group_size_redundancy=1, tags=["FL"])
    assert config.num_envs == 6 and [
        p.env_ids for p in RolloutScheduler(config, _TimedExecutor(lambda t: 0), pad_token_id=0).groups
    ] == [(0, 1, 2), (3, 4, 5)]
    slow = _StragglerExecutor(slow=0)
    out = RolloutScheduler(config, slow, pad_token_id=0).get_batch(4)
    assert sorted(slow.started) == [0, 1, 2, 3, 4, 5] and sorted(slow.cancelled) == [0, 3]  # the stragglers
    assert [(e.task.group_id, e.task.env_id) for e in out.episodes] == [(0, 1), (0, 2), (1, 4), (1, 5)]
    assert out.metrics["rollout/episodes_cancelled"] == 2 and out.metrics["rollout/groups_kept"] == 2
    assert len({e.task.seed for e in out.episodes if e.task.group_id == 0}) == 1  # one seed per round
    # a faulted episode does not fill the group while a healthy one can: the round is kept, not replaced
    faulty = _StragglerExecutor(faulty=0)
    out = RolloutScheduler(config, faulty, pad_token_id=0).get_batch(4)
    assert faulty.cancelled == []
    assert out.metrics["rollout/groups_kept"] == 2 and out.metrics["rollout/groups_launched"] == 2
    assert out.metrics["rollout/episodes_cancelled"] == 0 and out.metrics["rollout/env_faults"] == 2  # counted
    assert sorted(e.task.env_id for e in out.episodes) == [0, 1, 2, 3, 4, 5]  # every episode played, reported
    assert out.batch is not None and len(out.batch) == 4  # the healthy ones (a faulted episode has no sample)
    # without redundancy the fault drops the round and a replacement is played
    plain = EnvManagerConfig(name="train_env", num_env_groups=2, group_size=3, tags=["FL"])
    out = RolloutScheduler(plain, _StragglerExecutor(faulty=0), pad_token_id=0).get_batch(6)
    assert out.metrics["rollout/groups_faulted"] >= 2 and "rollout/episodes_cancelled" not in out.metrics


def test_episodes_finishing_beyond_the_group_are_reported_not_trained() -> None:
    """Episodes that finish together past ``group_size``: the round keeps the first in env order; the others are
    in the played episodes without their samples (dumped as not kept), not in the batch."""
    config = EnvManagerConfig(name="train_env", num_env_groups=2, group_size=2, group_size_redundancy=1, tags=["FL"])
    out = RolloutScheduler(config, _SampleExecutor(lambda t: 0.0), pad_token_id=0).get_batch(4)
    assert len(out.batch) == 4
    # all three episodes of a round finish in the same pass of the event loop: none is left to cancel
    assert len(out.episodes) == 6 and out.metrics["rollout/episodes_cancelled"] == 0
    extra = [(e.task.group_id, e.task.env_id) for e in out.episodes if e.batch is None]
    assert extra == [(0, 2), (1, 5)] and all(e.end_reason == "terminated" for e in out.episodes)
    # validation reads the rounds' group_size episodes only
    val = RolloutScheduler(config, _SampleExecutor(lambda t: 0.0), pad_token_id=0, mode="val").get_batch(4)
    assert len(val.episodes) == 4 and val.metrics["val/episodes"] == 4


def test_a_round_with_too_few_healthy_episodes_keeps_group_size_and_is_judged_faulted() -> None:
    config = EnvManagerConfig(
        name="train_env", num_env_groups=1, group_size=2, group_size_redundancy=1, tags=["FL"], max_launch_factor=1
    )
    executor = _StragglerExecutor(faulty=0)
    original = executor.run

    async def two_faults(task) -> EpisodeResult:
        result = await original(task)
        return EpisodeResult(task, "env_timeout", 0, False, 0.0, None, None) if task.env_id == 1 else result

    executor.run = two_faults
    out = RolloutScheduler(config, executor, pad_token_id=0).get_batch(2)
    assert out.batch is None and out.metrics["rollout/groups_faulted"] == 1
    assert out.episodes[2].batch is None  # finished but not in the round: not trained on (dumped as not kept)
    # the round's two (the first to finish), then the one finished after them: all reported
    assert [(e.task.env_id, e.end_reason) for e in out.episodes] == [
        (0, "env_error"),
        (1, "env_timeout"),
        (2, "terminated"),
    ]


def test_the_launch_limit_is_the_managers_setting() -> None:
    """Every round faulted: a step launches max_launch_factor x the groups it needs, from the manager's config
    unless the scheduler is given its own."""
    config = EnvManagerConfig(name="train_env", num_env_groups=4, group_size=2, tags=["FL"], max_launch_factor=3)
    executor = _TimedExecutor(lambda t: 0.0)  # rounds without samples count as faulted
    assert RolloutScheduler(config, executor, pad_token_id=0).get_batch(4).metrics["rollout/groups_launched"] == 6
    one = RolloutScheduler(config, executor, pad_token_id=0, max_launch_factor=1)
    assert one.get_batch(4).metrics["rollout/groups_launched"] == 2
    assert EnvManagerConfig(tags=["FL"]).max_launch_factor == 4
    with pytest.raises(ConfigError, match="max_launch_factor"):
        EnvManagerConfig(tags=["FL"], max_launch_factor=0)


def test_scheduler_state_resumes_the_training_rounds() -> None:
    config = EnvManagerConfig(name="train_env", num_env_groups=4, group_size=2, tags=["FL"])
    executor = _TimedExecutor(lambda t: 0.0)  # rounds without samples count as faulted: one launch per group asked
    uninterrupted = RolloutScheduler(config, executor, pad_token_id=0, max_launch_factor=1)
    uninterrupted.get_batch(6)
    saved = uninterrupted.state()
    resumed = RolloutScheduler(config, executor, pad_token_id=0, max_launch_factor=1)
    resumed.load_state(saved)
    assert saved == {"next_episode": [1, 1, 1, 0], "cursor": 3}  # a synchronous step leaves no round to replay
    assert _rounds(resumed.get_batch(6)) == _rounds(uninterrupted.get_batch(6))
    assert resumed.state() == uninterrupted.state() == {"next_episode": [2, 2, 1, 1], "cursor": 2}


def test_rounds_carried_over_by_an_async_checkpoint_are_played_first_in_order() -> None:
    """An asynchronous run's checkpoint lists the rounds launched but not trained on (``replay``); a resumed run,
    synchronous here, plays them first with their own seeds, then goes on from ``next_episode``; what a call
    leaves of them stays in the next checkpoint."""
    config = EnvManagerConfig(name="train_env", num_env_groups=4, group_size=2, tags=["FL"])
    scheduler = RolloutScheduler(config, _TimedExecutor(lambda t: 0.0), pad_token_id=0, max_launch_factor=1)
    scheduler.load_state({"next_episode": [3, 2, 2, 2], "cursor": 1, "replay": [[1, 1], [2, 1], [0, 2]]})
    first = scheduler.get_batch(4)
    assert _rounds(first) == sorted((g, e, episode_seed(0, g, e)) for g, e in [(1, 1), (2, 1)])
    assert scheduler.state() == {"next_episode": [3, 2, 2, 2], "cursor": 1, "replay": [[0, 2]]}
    assert [(g, e) for g, e, _ in _rounds(scheduler.get_batch(6))] == [(0, 2), (1, 2), (2, 2)]
    assert scheduler.state() == {"next_episode": [3, 3, 3, 2], "cursor": 3}
    capped = RolloutScheduler(
        config.model_copy(update={"max_traj_per_env": 1}), _TimedExecutor(lambda t: 0.0), pad_token_id=0
    )
    capped.load_state({"next_episode": [5, 3, 0, 0], "cursor": 0, "replay": [[0, 3], [0, 4], [1, 2]]})
    capped.max_launch_factor = 1
    # group 0 may play one round a call: its second carried-over round waits, group 1's goes first
    assert [(g, e) for g, e, _ in _rounds(capped.get_batch(4))] == [(0, 3), (1, 2)]
    assert capped.state() == {"next_episode": [5, 3, 0, 0], "cursor": 0, "replay": [[0, 4]]}


def test_a_checkpoint_of_another_group_count_and_a_filter_that_does_not_import_are_named() -> None:
    config = EnvManagerConfig(name="train_env", num_env_groups=4, group_size=2, tags=["FL"])
    scheduler = RolloutScheduler(config, _TimedExecutor(lambda t: 0.0), pad_token_id=0)
    with pytest.raises(ConfigError, match="the checkpoint's train_env has 3 env groups and this config 4"):
        scheduler.load_state({"next_episode": [1, 1, 1], "cursor": 0})
    typo = config.model_copy(update={"group_filter_cls": "roll.agentic.scheduler.filters:ZeroVarianceFilter"})
    with pytest.raises(ConfigError, match=r"train_env.group_filter_cls='roll.agentic.scheduler.filters:Zero"):
        RolloutScheduler(typo, _TimedExecutor(lambda t: 0.0), pad_token_id=0)


def _sampling_seeds(out) -> dict[str, int | None]:
    return {e.task.traj_id: e.task.sampling_seed for e in out.episodes}


def test_episodes_get_sampling_seeds_of_the_run_seed_round_and_env_slot() -> None:
    config = EnvManagerConfig(name="train_env", num_env_groups=2, group_size=3, tags=["FL"])

    def play(seed: int, mode: str = "train", step: int = 0) -> dict[str, int | None]:
        executor = _TimedExecutor(lambda t: 0.0)  # rounds without samples count as faulted: one launch per group
        scheduler = RolloutScheduler(config, executor, pad_token_id=0, mode=mode, seed=seed, max_launch_factor=1)
        return _sampling_seeds(scheduler.get_batch(6, step))

    first = play(1)
    assert len(first) == 6 and len(set(first.values())) == 6  # a group's envs share the env seed, not the samples
    assert play(1) == first
    assert set(play(2).values()).isdisjoint(first.values())
    # Validation replays the same rounds (same env seeds, same traj ids) at every step, with fresh samples per step.
    val_0, val_3 = play(1, "val", 0), play(1, "val", 3)
    assert play(1, "val", 0) == val_0 and val_3.keys() == val_0.keys()
    assert set(val_3.values()).isdisjoint(val_0.values())


def test_episodes_cut_by_the_context_are_warned_about_once_per_tag(tokenizer, caplog) -> None:
    # The start-up check proves only that the first turn fits: FrozenLake's ~360-token first prompt fits in 400, its
    # second turn does not, and without a warning the user saw nothing but rollout/end_reason/context_limit.
    envs = {"FL": CustomEnvConfig(env_type="frozen_lake", env_config={"size": 4}, max_steps=4)}
    client = MockPolicyClient(
        tokenizer, RandomActionPolicy(ACTIONS, invalid_prob=0.0), LatencyModel(per_token_median_s=1e-4)
    )
    scheduler = RolloutScheduler.local(
        EnvManagerConfig(num_env_groups=2, group_size=2, tags=["FL"]),
        envs,
        tokenizer,
        client,
        generation_config=GenerationConfig(max_new_tokens=16),
        sequence_length=400,
    )
    try:
        with caplog.at_level("WARNING", logger="roll.agentic.scheduler.metrics"):
            first = scheduler.get_batch(4)
            scheduler.get_batch(4)
    finally:
        scheduler.close()
    cut = [e for e in first.episodes if e.end_reason == "context_limit"]
    assert cut and {e.num_turns for e in cut} == {1}
    warnings = [r.getMessage() for r in caplog.records if "context_limit" in r.getMessage()]
    assert warnings == [
        f"train_env: env tag 'FL': {len(cut)} of 4 episodes ended context_limit after 1.0 turns on average (the next "
        "turn did not fit in rollout.sequence_length, ROLL's sequence_length); raise it, or lower the tag's "
        "max_steps, max_tokens_per_step or history; shown once per tag"
    ]
