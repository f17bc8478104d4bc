"""The agentic pipelines end to end on a nano model (FSDP2 training, HF rollouts, weight sync), with faulty envs.

* ``agentic``: a warm-up step, two RL steps and validations while one env tag raises, hangs past its step timeout
  or returns malformed output depending on the seed. The run goes on; training replaces the faulted groups,
  validation counts faulted episodes as failures; every fault is in the metrics.
* ``agentic`` with an env that always faults: it stops after ``rollout.max_faulted_steps`` steps, output kept.
* ``agentic_rollout``: the trajectories are written, every episode (faulted ones too) listed with why it ended; with
  ``llm_proxy: random`` no model is started, and a second run writes the same rollouts.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.pipeline import AgenticConfig, register_pipelines
from roll.agentic.pipeline.rollout_only import AgenticRolloutPipeline
from roll.agentic.scheduler import RolloutFaultsError
from roll.pipelines.checkpoint import write_manifest
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

pytestmark = pytest.mark.integration
MODEL = "tiny://nano?seed=0"


class FaultyEnv:
    """Seed % 3: 0 raises in step(), 1 hangs past the timeout, 2 returns a malformed step (a 3-tuple)."""

    def __init__(self, hang_s: float = 3.0) -> None:
        self.hang_s, self.seed = hang_s, 0

    def reset(self, seed=None):
        self.seed = seed or 0
        return "a quiet room", {"success": False}

    def step(self, action):
        kind = self.seed % 3
        if kind == 0:
            raise RuntimeError("env crashed")
        if kind == 1:
            time.sleep(self.hang_s)
            return "late", 1.0, True, False, {"success": True}
        return "garbage", 1.0, True


def _envs() -> dict[str, Any]:
    lake = {
        "env_type": "frozen_lake",
        "env_config": {"size": 3, "grid_vocab": {}, "env_instruction": "FrozenLake."},
        "max_steps": 2,
        "max_tokens_per_step": 8,
        "agent_system_template": None,
        "agent_template": "{observation}",
    }
    faulty = {"env_type": f"{__name__}:FaultyEnv", "max_steps": 2, "max_tokens_per_step": 8, "step_timeout_s": 0.5}
    return {"Lake": lake, "Faulty": faulty}


def _manager(groups: int, size: int) -> dict[str, Any]:
    return {"num_env_groups": groups, "group_size": size, "tags": ["Lake", "Faulty"]}


def _role(name: str, strategy: str) -> dict[str, Any]:
    role = {"name": name, "model_args": {"model_name_or_path": MODEL, "dtype": "float32"}}
    role["strategy_args"] = {"strategy_name": strategy}
    return role


def test_agentic_run_survives_env_faults(ray_env, tmp_path: Path):
    register_pipelines()
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path),
        "max_steps": 2,
        "eval_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 8,  # every train group once: 2 Lake groups, 2 Faulty groups that fault
        "sequence_length": 256,
        "rollout": {"env_workers": "local", "dump": True},
        "warmup": {
            "steps": 1,
            "episodes_per_step": 4,
            "num_mini_batches": 2,
            "learning_rate": 3e-4,  # RL then runs at training_args.learning_rate
            "policy": "roll.agentic.policy.mock:RandomActionPolicy",
            "policy_kwargs": {"actions": ["Up", "Down", "Left", "Right"]},
        },
        "custom_envs": _envs(),
        "train_env_manager": _manager(4, 2),
        "val_env_manager": _manager(6, 1),
        "actor_train": {**_role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("agentic-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    run_config(load_config(data))
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert metrics[0]["warmup/optimizer_steps"] == 2  # one warm-up step in two mini-batches
    assert metrics[0]["warmup/learning_rate"] == pytest.approx(3e-4)
    assert [m["actor/lr"] for m in metrics[1:]] == pytest.approx([1e-4, 1e-4])
    for row in metrics[1:]:
        assert row["rollout/env_faults"] >= 1  # the Faulty tag faulted ...
        assert row["rollout/groups_faulted"] >= 1  # ... its groups were dropped and replaced
        assert row["rollout/groups_kept"] == 4  # the batch still filled (with Lake groups): 8 episodes
        assert row["rollout/faulted_steps_in_a_row"] == 0  # faults that leave samples never count towards a stop
        assert row["rollout/samples"] == 8
        assert "actor/pg_loss" in row  # and the policy trained on them
    for row in metrics:  # validation keeps every episode; the faulted ones count as failures
        assert row["val/episodes"] == 6
        reasons = {k.split("/")[-1]: v for k, v in row.items() if k.startswith("val/end_reason/")}
        assert reasons.get("env_error", 0) + reasons.get("env_timeout", 0) + reasons.get("env_malformed", 0) >= 1
        assert row["val/Faulty/success"] == 0.0
    episodes = [json.loads(line) for line in (tmp_path / "rollouts" / "step-000001-episodes.jsonl").open()]
    faulted = [e for e in episodes if e["end_reason"].startswith("env_")]
    assert faulted and all(not e["kept"] and e["error"] for e in faulted)


class DownEnv:
    """An env whose service is down: every reset raises."""

    def reset(self, seed=None):
        raise ConnectionError("env service is down")

    def step(self, action):
        raise ConnectionError("env service is down")


@pytest.mark.pipeline_run
def test_agentic_run_stops_when_env_faults_leave_nothing_to_train(ray_env, tmp_path: Path):
    """Every group faults at every step: after rollout.max_faulted_steps such steps the run stops with one error naming
    the tag, the reason with its count and an example; what was written before (metrics, checkpoints) stays."""
    register_pipelines()
    down = {"env_type": f"{__name__}:DownEnv", "max_steps": 2, "max_tokens_per_step": 8}
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path),
        "max_steps": 6,
        "save_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local", "max_faulted_steps": 2},
        "custom_envs": {"Down": down},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Down"]},
        "actor_train": {**_role("down-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("down-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    with pytest.raises(RolloutFaultsError) as caught:
        run_config(load_config(data))
    # 2 groups a step, each launched 4 times (max_launch_factor) and faulted: 16 episodes a step
    assert str(caught.value).startswith(
        "train_env: 2 steps in a row (steps 1-2) kept no sample because of env faults (env tags ['Down']: env_error "
        "x32; e.g. tag 'Down' env_error: reset() raised ConnectionError: env service is down). "
    )
    assert "rollout.max_faulted_steps=2 is how many such steps stop a run (0 or null: never)" in str(caught.value)
    assert str(caught.value).endswith(f"Metrics and checkpoints written so far are kept in {tmp_path}")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert [m["rollout/faulted_steps_in_a_row"] for m in metrics[1:]] == [1.0, 2.0]
    assert [m["rollout/env_faults"] for m in metrics[1:]] == [16.0, 16.0]
    saved = [p.name[-8:] for p in (tmp_path / "checkpoints").iterdir() if p.name[-8:].isdigit()]
    assert saved == ["00000001"]  # step 2 stopped before its own


class DownRandomEnv(DownEnv):
    """DownEnv with its own random actions (llm_proxy random needs them)."""

    def sample_random_action(self) -> str:
        return "Up"


def _down_run(pipeline: str, output_dir: Path) -> dict[str, Any]:
    """A one-step run of ``pipeline`` on DownRandomEnv, stopping at 2 faulted steps in a row."""
    data: dict[str, Any] = {
        "pipeline_cls": pipeline,
        "output_dir": str(output_dir),
        "max_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 2,
        "sequence_length": 256,
        "rollout": {"env_workers": "local", "max_faulted_steps": 2},
        "custom_envs": {"Down": {"env_type": f"{__name__}:DownRandomEnv", "max_steps": 2, "max_tokens_per_step": 8}},
        "train_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["Down"]},
        "actor_infer": {**_role("down-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    if pipeline == "agentic":
        data.update(advantage={"estimator": "reinforce"})
        data["actor_train"] = {**_role("down-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}}
    else:  # no model: the env's own random actions
        data["train_env_manager"]["llm_proxy"] = {"proxy_type": "random"}
    return data


@pytest.mark.pipeline_run
@pytest.mark.parametrize("pipeline", ["agentic_rollout", "agentic"])
def test_the_faulted_steps_in_a_row_go_on_across_a_resume(ray_env, tmp_path: Path, pipeline: str):
    """rollout.max_faulted_steps counts steps in a row across a checkpoint: a run resumed after one faulted step
    stops at its next one (steps 1-2). Before, the checkpoint did not keep the streak, so a run restarted (a
    preempted job resumed with resume_from_checkpoint: auto) more often than the limit never stopped."""
    register_pipelines()
    data = _down_run(pipeline, tmp_path)
    run_config(load_config(data))  # one faulted step: below the limit
    with pytest.raises(RolloutFaultsError, match=r"2 steps in a row \(steps 1-2\) kept no sample"):
        run_config(load_config({**data, "max_steps": 4, "resume_from_checkpoint": "auto"}))
    metrics = [m for m in read_metrics(tmp_path / "metrics.jsonl") if m["step"] > 0]
    assert [(m["step"], m["rollout/faulted_steps_in_a_row"]) for m in metrics] == [(1, 1.0), (2, 2.0)]


@pytest.mark.pipeline_run
def test_an_async_agentic_run_stops_after_max_faulted_steps(ray_env, tmp_path: Path):
    """Asynchronous rollouts (asynchrony.generation_ratio) honour rollout.max_faulted_steps as a synchronous run does:
    a step whose launch budget faulted trains on nothing, and the second such step in a row stops the run with the
    same RolloutFaultsError, metrics kept. Before, the background rollouts raised RolloutsStalledError at step 1."""
    register_pipelines()
    data = {**_down_run("agentic", tmp_path), "max_steps": 4, "asynchrony": {"generation_ratio": 1}}
    with pytest.raises(RolloutFaultsError) as caught:
        run_config(load_config(data))
    assert re.match(
        r"train_env: 2 steps in a row \(steps 1-2\) kept no sample because of env faults", str(caught.value)
    )
    assert "rollout.max_faulted_steps=2 is how many such steps stop a run (0 or null: never)" in str(caught.value)
    metrics = [m for m in read_metrics(tmp_path / "metrics.jsonl") if m["step"] > 0]
    assert [(m["step"], m["rollout/faulted_steps_in_a_row"]) for m in metrics] == [(1, 1.0), (2, 2.0)]
    # each step: its budget, 2 groups x max_launch_factor 4 rounds, dropped (one more may have finished meanwhile)
    assert all(m.get("rollout/groups_kept", 0) == 0 and m["rollout/groups_faulted"] >= 8 for m in metrics)


@pytest.mark.pipeline_run
def test_agentic_rollout_writes_every_episode(ray_env, tmp_path: Path):
    register_pipelines()
    data = {
        "pipeline_cls": "agentic_rollout",
        "output_dir": str(tmp_path),
        "max_steps": 1,
        "plots": False,
        "mode": "val",
        "rollout_batch_size": 6,
        "sequence_length": 256,
        "rollout": {"env_workers": "local"},
        "custom_envs": _envs(),
        "train_env_manager": _manager(6, 1),
        "actor_infer": {**_role("rollout-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    run_config(load_config(data))
    folder = tmp_path / "rollouts"
    episodes = [json.loads(line) for line in (folder / "step-000001-episodes.jsonl").open()]
    rows = [json.loads(line) for line in (folder / "step-000001.jsonl").open()]
    assert len(episodes) == 6
    assert {e["tag"] for e in episodes} == {"Lake", "Faulty"}
    faulted = [e for e in episodes if e["tag"] == "Faulty"]
    assert all(e["end_reason"] in ("env_error", "env_timeout", "env_malformed") for e in faulted)
    assert len(rows) == sum(e["kept"] for e in episodes)  # one sample row per kept (trajectory-wise) episode
    assert all(r["response"] and r["prompt"] for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["env_faults"] == len(faulted)


@pytest.mark.pipeline_run
def test_agentic_rollout_with_a_random_proxy_starts_no_model_and_replays(ray_env, tmp_path: Path, monkeypatch):
    register_pipelines()
    started: list[str] = []
    create_clusters = AgenticRolloutPipeline.create_clusters

    def spy(self, roles):
        started.extend(roles)
        return create_clusters(self, roles)

    monkeypatch.setattr(AgenticRolloutPipeline, "create_clusters", spy)
    manager = {"num_env_groups": 3, "group_size": 2, "tags": ["Lake"], "llm_proxy": {"proxy_type": "random"}}
    data = {
        "pipeline_cls": "agentic_rollout",
        "max_steps": 2,
        "plots": False,
        "rollout_batch_size": 6,
        "sequence_length": 256,
        "rollout": {"env_workers": "local"},
        "custom_envs": {"Lake": {**_envs()["Lake"], "max_tokens_per_step": 32}},
        "train_env_manager": manager,
        "actor_infer": {**_role("rollout-infer", "hf_infer"), "generating_args": {"max_new_tokens": 32}},
    }
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        run_config(load_config({**data, "output_dir": str(out)}))
    assert started == []  # actor_infer's tokenizer renders the prompts; its model is never loaded
    written = [sorted(p.name for p in (out / "rollouts").iterdir()) for out in runs]
    names = [f"step-00000{s}{kind}.jsonl" for s in (1, 2) for kind in ("", "-episodes")]
    assert written == [sorted(names)] * 2
    for name in names:  # the same moves and scores (groups in the order they finished): seeded random actions
        lines = [sorted((out / "rollouts" / name).read_text().splitlines()) for out in runs]
        assert lines[0] == lines[1]
    rows = [json.loads(line) for line in (runs[0] / "rollouts" / "step-000001.jsonl").open()]
    moves = {f"<answer>{move}</answer>" for move in ("Left", "Down", "Right", "Up")}
    assert len(rows) == 6 and all(r["response"].split("<|im_end|>")[0] in moves for r in rows)
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["episodes"] == 12 and summary["env_faults"] == 0
    assert [m["step"] for m in read_metrics(runs[0] / "metrics.jsonl")] == [1, 2]


@pytest.mark.pipeline_run
def test_agentic_validation_by_a_random_proxy_gets_no_policy_endpoint(ray_env, tmp_path: Path, monkeypatch):
    from roll.agentic.pipeline import pipeline as agentic

    register_pipelines()
    endpoints: list[bool] = []
    endpoint_cls = agentic.PolicyEndpoint

    def spy(*args, **kwargs):
        endpoints.append(kwargs.get("gated", False))
        return endpoint_cls(*args, **kwargs)

    monkeypatch.setattr(agentic, "PolicyEndpoint", spy)
    lake = {**_envs()["Lake"], "max_tokens_per_step": 32}
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path),
        "max_steps": 1,
        "eval_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "val_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local"},
        "custom_envs": {"Lake": lake},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
        "val_env_manager": {
            "num_env_groups": 4, "group_size": 1, "tags": ["Lake"], "llm_proxy": {"proxy_type": "random"}
        },
        "actor_train": {**_role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("agentic-infer", "hf_infer"), "generating_args": {"max_new_tokens": 32}},
    }  # fmt: skip
    run_config(load_config(data))
    assert endpoints == [False]  # the training rollouts' endpoint only
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    validated = [m for m in metrics if "val/success" in m]
    # every validation turn was a random move the env read as an action (the policy's would be the tiny model's)
    assert [m["step"] for m in validated] == [0, 1] and all(m["val/Lake/format"] == 1.0 for m in validated)


@pytest.mark.pipeline_run
@pytest.mark.parametrize("env_workers", ["local", "ray"])
def test_agentic_async_run_trains_on_bounded_stale_trajectories(ray_env, tmp_path: Path, env_workers: str):
    """async_generation_ratio 1 (ROLL's key): envs keep playing while the actor trains; every step's trajectories
    come from the policy it trains or the one before, none is trained on twice, and staleness is reported."""
    register_pipelines()
    lake = _envs()["Lake"]
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path),
        "max_steps": 3,
        "eval_steps": 3,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "async_generation_ratio": 1,
        "rollout": {"env_workers": env_workers, "dump": True},
        "custom_envs": {"Lake": lake},
        "train_env_manager": {"num_env_groups": 4, "group_size": 2, "tags": ["Lake"]},
        "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["Lake"]},
        "actor_train": {**_role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("agentic-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    config = load_config(data)
    assert isinstance(config, AgenticConfig)
    assert config.asynchrony.generation_ratio == 1
    run_config(config)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    seen: set[str] = set()
    for row in metrics[1:]:
        step = row["step"]
        assert row["rollout/samples"] == 4 and "actor/pg_loss" in row
        assert 0 <= row["async/batch_staleness_max"] <= 1 and row["async/staleness_max"] <= 1
        assert row["rollout/policy_lag"] <= 1
        rows = [json.loads(line) for line in (tmp_path / "rollouts" / f"step-{step:06d}.jsonl").open()]
        ids = {r["traj_id"] for r in rows}
        assert len(ids) == 4 and not ids & seen
        seen |= ids
    assert metrics[-1]["val/episodes"] == 2


def _trained_rounds(folder: Path, step: int) -> set[tuple[int, int]]:
    """The rounds ``(group_id, episode_id)`` step ``step`` trained on, from its rollout dump."""
    rows = [json.loads(line) for line in (folder / "rollouts" / f"step-{step:06d}.jsonl").open()]
    return {(int(r["traj_id"].split("_")[1]), int(r["traj_id"].split("_")[2])) for r in rows}


@pytest.mark.pipeline_run
def test_agentic_async_resume_plays_again_the_rounds_not_yet_trained_on(ray_env, tmp_path: Path):
    """The checkpoint of an async run lists the rounds launched (playing, or played and waiting in the buffer) but
    not trained on; they are in no step's batch so far, and the resumed run trains on nothing it trained before."""
    register_pipelines()
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path),
        "max_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "async_generation_ratio": 1,
        "rollout": {"env_workers": "local", "dump": True},
        "custom_envs": {"Lake": _envs()["Lake"]},
        "train_env_manager": {"num_env_groups": 4, "group_size": 2, "tags": ["Lake"]},
        "actor_train": {**_role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("agentic-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    run_config(load_config(data))
    state = json.loads((tmp_path / "checkpoints" / "step-00000001" / "pipeline_state.json").read_text())
    saved = state["data_state"]
    replay = [tuple(pair) for pair in saved["replay"]]
    trained = _trained_rounds(tmp_path, 1)
    assert len(trained) == 2 and 0 < len(replay) <= 4  # at most (1 + ratio) steps' groups run ahead
    assert all(episode < saved["next_episode"][group] for group, episode in replay)  # launched before the save
    assert not set(replay) & trained
    assert sum(saved["buffer"]["staleness_histogram"].values()) == 4  # step 1's 4 trajectories
    run_config(load_config({**data, "max_steps": 2, "resume_from_checkpoint": "auto"}))
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert not _trained_rounds(tmp_path, 2) & trained
    # the staleness counters go on across the resume: steps 1 and 2, not step 2 alone
    state = json.loads((tmp_path / "checkpoints" / "step-00000002" / "pipeline_state.json").read_text())
    assert sum(state["data_state"]["buffer"]["staleness_histogram"].values()) == 8


@pytest.mark.pipeline_run
def test_a_resumed_run_counts_the_rl_time_before_its_checkpoint_against_max_rl_time_s(ray_env, tmp_path: Path):
    """max_rl_time_s bounds the run's RL time, resumes included: a run whose first start used up its hour (its
    checkpoint's time/rl_elapsed_s set to 3600 s) stops after one more step when resumed, and its time/rl_elapsed_s
    goes on from the checkpoint's. Before, the clock started again at the resume, so each restart of a preempted
    run got the whole budget again (here: it ran on to max_steps)."""
    register_pipelines()
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(tmp_path),
        "max_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local"},
        "custom_envs": {"Lake": _envs()["Lake"]},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
        "actor_train": {**_role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        "actor_infer": {**_role("agentic-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
    }
    run_config(load_config(data))
    checkpoint = tmp_path / "checkpoints" / "step-00000001"
    state = json.loads((checkpoint / "pipeline_state.json").read_text())
    assert state["metrics_history"][-1]["step"] == 1
    state["metrics_history"][-1]["time/rl_elapsed_s"] = 3600.0  # as if step 1 had ended an hour into RL
    (checkpoint / "pipeline_state.json").write_text(json.dumps(state))
    write_manifest(checkpoint)
    run_config(load_config({**data, "max_steps": 3, "max_rl_time_s": 3600, "resume_from_checkpoint": "auto"}))
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]  # out of time after step 2
    assert metrics[-1]["time/rl_elapsed_s"] > 3600
    assert (tmp_path / "checkpoints" / "step-00000002").is_dir()  # the stop is checkpointed, as out of time always is


@pytest.mark.pipeline_run
def test_agentic_rollout_mock_dump_then_replay_trains_identically(ray_env, tmp_path: Path):
    """ROLL's rollout_mock: a dump run writes each step's batch; a replay run (mode mock) trains on those batches
    instead of playing, so its losses equal the dump run's; a step that was never dumped is an error naming it.

    The replay run asks for one step more than was dumped: it trains the two dumped steps, then stops at the third
    with that error (one run for both checks: each run starts the actors anew)."""
    register_pipelines()

    def run(mode: str, out: Path, steps: int) -> None:
        data = {
            "pipeline_cls": "agentic",
            "output_dir": str(out),
            "max_steps": steps,
            "eval_steps": 2,
            "export_hf": False,
            "plots": False,
            "rollout_batch_size": 4,
            "sequence_length": 256,
            "rollout": {"env_workers": "local"},
            "rollout_mock": {"enable": True, "mode": mode, "dump_dir": str(tmp_path / "dumps")},
            "custom_envs": {"Lake": _envs()["Lake"]},
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
            "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["Lake"]},
            "actor_train": {**_role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
            "actor_infer": {**_role("agentic-infer", "hf_infer"), "generating_args": {"max_new_tokens": 8}},
        }
        run_config(load_config(data))

    run("dump", tmp_path / "dump", steps=2)
    dumped = read_metrics(tmp_path / "dump" / "metrics.jsonl")
    assert sorted(p.name for p in (tmp_path / "dumps" / "train").iterdir()) == ["step_000001.pkl", "step_000002.pkl"]
    assert sorted(p.name for p in (tmp_path / "dumps" / "val").iterdir()) == ["step_000000.pkl", "step_000002.pkl"]
    with pytest.raises(Exception, match="step 3 has no dump at .*step_000003.pkl"):
        run("mock", tmp_path / "replay", steps=3)
    replayed = read_metrics(tmp_path / "replay" / "metrics.jsonl")
    assert [m["step"] for m in replayed] == [m["step"] for m in dumped] == [0, 1, 2]  # steps 1-2 trained, 3 failed
    assert replayed[0]["val/success"] == dumped[0]["val/success"] and replayed[0]["val/episodes"] == 2
    for a, b in zip(dumped[1:], replayed[1:], strict=True):
        assert b["rollout/samples"] == a["rollout/samples"]
        assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], abs=1e-6)
        assert b["rollout/success"] == a["rollout/success"]  # the dump's rollout metrics come back
