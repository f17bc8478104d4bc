"""``warmup.cache``: the key covers what shapes the warm-up (and nothing else), and a cached warm-up starts RL
from exactly the state a fresh one leaves (same validation at step 0, same first RL step). A resumed run gets the
warmed-up clone back and continues the uninterrupted one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.pipeline import AgenticConfig, register_pipelines, warmup_cache
from roll.agentic.pipeline.warmup_cache import WarmupCache, warmup_key
from roll.pipelines.config import load_config
from roll.pipelines.launcher import run_config
from roll.pipelines.tracking import read_metrics

LAKE = {
    "env_type": "frozen_lake",
    # the format penalty gives RL's first step a non-zero loss (the nano model never answers in format)
    "env_config": {"size": 3, "grid_vocab": {}, "env_instruction": "FrozenLake.", "format_penalty": -0.1},
    "max_steps": 2,
    "max_tokens_per_step": 8,
    "agent_system_template": None,
    "agent_template": "{observation}",
}


def _data(model: str, **extra: Any) -> dict[str, Any]:
    def role(name: str, strategy: str) -> dict[str, Any]:
        return {
            "name": name,
            "model_args": {"model_name_or_path": model, "dtype": "float32"},
            "strategy_args": {"strategy_name": strategy},
        }

    data = {
        "pipeline_cls": "agentic",
        "adv_estimator": "reinforce",  # the episode score itself: a non-zero first RL step
        "max_steps": 2,
        "eval_steps": 1,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local"},
        "warmup": {
            "steps": 2,
            "episodes_per_step": 4,
            "learning_rate": 3e-4,
            "cache": True,
            "policy": "roll.agentic.policy.mock:RandomActionPolicy",
            "policy_kwargs": {"actions": ["Up", "Down", "Left", "Right"]},
        },
        "custom_envs": {"Lake": LAKE, "Other": {**LAKE, "max_steps": 3}},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
        "val_env_manager": {"num_env_groups": 4, "group_size": 1, "tags": ["Lake"]},
        "actor_train": {**role("agentic-train", "fsdp2_train"), "training_args": {"learning_rate": 1e-4}},
        # greedy rollouts, so that two runs from the same weights play the same episodes
        "actor_infer": {
            **role("agentic-infer", "hf_infer"),
            "generating_args": {"max_new_tokens": 8, "temperature": 0.0},
        },
    }
    for dotted, value in extra.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


def _key(tmp_path: Path, **extra: Any) -> str:
    return warmup_key(AgenticConfig.model_validate(_data(str(tmp_path), **extra)))


def test_key_changes_with_what_shapes_the_warm_up_only(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    base = _key(tmp_path)
    assert _key(tmp_path) == base
    # the RL side (loss, rollouts of RL, validation, step counts of RL) does not touch the warm-up
    assert _key(tmp_path, policy_loss__loss_agg_mode="seq-mean-token-mean", policy_loss__entropy_coef=0.01) == base
    assert _key(tmp_path, val_env_manager__num_env_groups=8, rollout_batch_size=8, eval_steps=5) == base
    assert _key(tmp_path, warmup__cache=False) == base
    assert _key(tmp_path, warmup__reference="model") == base  # what the reference gets after it
    assert _key(tmp_path, max_steps=7) == base  # under a constant schedule the run's length does not matter
    assert _key(tmp_path, seed=7) == base  # the warm-up follows warmup.seed (the cached-run test checks it)
    # the training manager's RL-only settings: the warm-up plays without a group filter or redundant episodes
    assert _key(tmp_path, train_env_manager__group_size_redundancy=1) == base
    assert (
        _key(tmp_path, train_env_manager__group_filter_cls="roll.agentic.scheduler.filters.ZeroVarianceGroupFilter")
        == base
    )
    assert _key(tmp_path, actor_infer__generating_args={"max_new_tokens": 8, "temperature": 0.3}) == _key(
        tmp_path, actor_infer__generating_args={"max_new_tokens": 8}
    )  # sampling settings do not reach the scripted policy; the length its turns are cut to does (below)
    # RL's rate, where the warm-up has its own (the cached-run test checks a loaded entry trains at it)
    assert _key(tmp_path, actor_train__training_args={"learning_rate": 2e-4}) == base
    cosine = {"learning_rate": 1e-4, "lr_scheduler_type": "cosine"}
    assert _key(tmp_path, actor_train__training_args=cosine) != _key(
        tmp_path, actor_train__training_args=cosine, max_steps=7
    )
    changed = [
        _key(tmp_path, warmup__steps=3),
        _key(tmp_path, warmup__learning_rate=1e-3),
        _key(tmp_path, warmup__policy_kwargs={"actions": ["Up"]}),
        _key(tmp_path, train_env_manager__tags=["Other"]),
        _key(tmp_path, train_env_manager__group_size=4),
        _key(tmp_path, actor_train__training_args={"learning_rate": 2e-4}, warmup__learning_rate=None),
        _key(tmp_path, actor_train__training_args={"learning_rate": 1e-4, "weight_decay": 0.1}),
        _key(tmp_path, sequence_length=512),
        _key(tmp_path, actor_infer__generating_args={"max_new_tokens": 3}),
        _key(tmp_path, train_env_manager__generating_args={"max_new_tokens": 3}),
        _key(tmp_path, warmup__seed=7),
        _key(tmp_path, warmup__group_size=2),  # the training groups' copies of a layout (2 here) instead of 1
    ]
    assert len({base, *changed}) == len(changed) + 1
    (tmp_path / "model.safetensors").write_bytes(b"weights")  # the model folder's files
    assert _key(tmp_path) != base


def test_key_follows_the_code_no_version_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A training env's module (a user's env edited between runs), the warm-up policy's module and a roll package
    installed in development mode (its ``src``, not its tests) are in the key; an env training does not play is not."""
    model, code = tmp_path / "model", tmp_path / "code"  # apart: the model folder's files are in the key
    model.mkdir()
    code.mkdir()
    monkeypatch.syspath_prepend(str(code))
    origin: dict[str, Any] = {}  # where the installer says each roll package came from: regular installs first
    monkeypatch.setattr(warmup_cache, "_install_origin", lambda package: origin)
    train, val = code / "lake_for_key.py", code / "val_lake_for_key.py"
    for module in (train, val):
        module.write_text(
            "from roll.agentic.env.frozen_lake import FrozenLakeEnv\n\n\nclass Lake(FrozenLakeEnv):\n    pass\n"
        )
    envs = {"Lake": {**LAKE, "env_type": "lake_for_key:Lake"}, "Other": {**LAKE, "env_type": "val_lake_for_key:Lake"}}
    base = _key(model, custom_envs=envs)
    val.write_text(val.read_text() + "# edited\n")
    assert _key(model, custom_envs=envs) == base
    train.write_text(train.read_text() + "# edited\n")
    edited = _key(model, custom_envs=envs)
    assert edited != base
    policy = {"custom_envs": envs, "warmup__policy": "val_lake_for_key:Lake"}  # the warm-up policy's module too
    before = _key(model, **policy)
    val.write_text(val.read_text() + "# again\n")
    assert _key(model, **policy) != before

    project = code / "roll-dev"
    (project / "src" / "roll").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "src" / "roll" / "gen.py").write_text("DEPTH = 6\n")
    (project / "tests" / "test_gen.py").write_text("")
    origin.update({"dir_info": {"editable": True}, "url": project.as_uri()})
    development = _key(model, custom_envs=envs)
    assert development != edited
    (project / "tests" / "test_gen.py").write_text("assert True\n")
    assert _key(model, custom_envs=envs) == development
    (project / "src" / "roll" / "gen.py").write_text("DEPTH = 7\n")
    assert _key(model, custom_envs=envs) != development
    origin["dir_info"] = {}  # a regular install from a folder: its version pins its code
    assert _key(model, custom_envs=envs) == edited


@pytest.mark.pipeline_run
@pytest.mark.integration
def test_cached_warm_up_starts_rl_from_the_same_state(ray_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    register_pipelines()

    def run(name: str, **extra: Any) -> list[dict[str, Any]]:
        run_config(load_config(_data("tiny://nano?seed=0", output_dir=str(tmp_path / name), **extra)))
        return read_metrics(tmp_path / name / "metrics.jsonl")

    fresh = run("fresh")
    entries = [p for p in (tmp_path / "cache" / "agentic-warmup").iterdir()]
    assert [p.name for p in entries] == [fresh_key := entries[0].name] and (entries[0] / "warmup.json").is_file()
    cached = run("cached")
    faster = run("faster", actor_train__training_args={"learning_rate": 2e-4})  # loads the entry, RL at its own rate
    # a run with other RL loss settings and no cache trains the same warm-up (behaviour cloning ignores them)
    other_loss = run("other_loss", warmup__cache=False, policy_loss__loss_agg_mode="seq-mean-token-mean")
    # so does a run with another seed (the key leaves the seed out): its RL and validation differ, the warm-up not
    other_seed = run("other_seed", warmup__cache=False, seed=7)
    assert other_seed[0]["warmup/nll"] == pytest.approx(fresh[0]["warmup/nll"], rel=1e-6)
    assert other_seed[0]["warmup/expert_success"] == fresh[0]["warmup/expert_success"]
    assert [p.name for p in (tmp_path / "cache" / "agentic-warmup").iterdir()] == [fresh_key]

    assert fresh[0]["warmup/cached"] == 0.0 and cached[0]["warmup/cached"] == faster[0]["warmup/cached"] == 1.0
    assert faster[0]["val/success"] == fresh[0]["val/success"]
    assert faster[1]["actor/lr"] == faster[2]["actor/lr"] == pytest.approx(2e-4)
    assert cached[0]["warmup/trained_s"] == pytest.approx(fresh[0]["time/warmup_s"])
    for row in (cached[0], other_loss[0]):
        assert row["warmup/nll"] == pytest.approx(fresh[0]["warmup/nll"])
        assert row["warmup/optimizer_steps"] == fresh[0]["warmup/optimizer_steps"] == 2
        assert row["val/success"] == fresh[0]["val/success"]
        assert row["val/Lake/generated_tokens"] == fresh[0]["val/Lake/generated_tokens"]
    # RL starts from the same weights (step 1's forward) and the same Adam moments and rate (step 2's, after
    # step 1's update)
    for step in (1, 2):
        assert cached[step]["actor/lr"] == pytest.approx(fresh[step]["actor/lr"]) == pytest.approx(1e-4)
        assert fresh[step]["actor/pg_loss"] != 0.0 and fresh[step]["actor/grad_norm"] > 0.0
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/log_prob", "actor/entropy"):
            assert cached[step][key] == pytest.approx(fresh[step][key], rel=1e-5, abs=1e-7), (step, key)
        assert cached[step]["val/success"] == fresh[step]["val/success"]


def test_entries_are_written_whole(tmp_path: Path):
    (tmp_path / "model").mkdir()
    cache = WarmupCache(AgenticConfig.model_validate(_data(str(tmp_path / "model"))), root=tmp_path / "cache")
    assert cache.metrics() is None
    staged = cache.staging()
    (staged / "actor_train").mkdir()
    assert cache.metrics() is None  # a staged entry is not an entry
    cache.commit(staged, {"warmup/nll": [1.0]})
    assert cache.metrics() == {"warmup/nll": [1.0]} and not staged.exists()
    again = cache.staging()  # a second writer of the same key: the first entry stays
    cache.commit(again, {"warmup/nll": [2.0]})
    assert cache.metrics() == {"warmup/nll": [1.0]} and not again.exists()


def test_a_save_removes_the_folders_of_saves_that_died_on_this_host(tmp_path: Path):
    (tmp_path / "model").mkdir()
    cache = WarmupCache(AgenticConfig.model_validate(_data(str(tmp_path / "model"))), root=tmp_path / "cache")
    cache.root.mkdir(parents=True)
    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no process has now
    died = cache.root / f".otherkey.tmp-{host}-{dead.pid}"
    running = cache.root / f".otherkey.tmp-{host}-{os.getppid()}"  # a live process still writing
    elsewhere = cache.root / f".otherkey.tmp-otherhost-{dead.pid}"  # another node's, on a shared filesystem
    for folder in (died, running, elsewhere):
        (folder / "actor_train").mkdir(parents=True)
    staged = cache.staging()
    assert staged.name == f".{cache.key}.tmp-{host}-{os.getpid()}"
    assert not died.exists() and running.exists() and elsewhere.exists()


@pytest.mark.pipeline_run
@pytest.mark.integration
def test_reference_is_anchored_on_the_warmed_up_policy_also_after_resume(ray_env, tmp_path: Path, monkeypatch, caplog):
    """``warmup.reference: warmed`` (the default): RL's first step measures KL 0 to the reference (it holds the
    clone); ``model`` leaves it on the model before behaviour cloning. A resumed run gets the clone back."""
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "cache"))
    register_pipelines()
    common = {"kl": {"use_loss": True, "loss_coef": 0.1}, "warmup__learning_rate": 1e-3, "save_steps": 1}
    reference = {
        "name": "agentic-ref",
        "model_args": {"model_name_or_path": "tiny://nano?seed=0", "dtype": "float32"},
        "strategy_args": {"strategy_name": "hf_infer"},
    }

    def run(name: str, **extra: Any) -> list[dict[str, Any]]:
        data = _data("tiny://nano?seed=0", output_dir=str(tmp_path / name), reference=reference, **common, **extra)
        run_config(load_config(data))
        return read_metrics(tmp_path / name / "metrics.jsonl")

    anchored = run("anchored")
    assert anchored[0]["warmup/reference_sync_s"] > 0
    assert anchored[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert anchored[2]["actor/kl_loss"] > 1e-6  # after one RL update the policy moved off the clone
    initial = run("initial", warmup__reference="model")
    assert "warmup/reference_sync_s" not in initial[0]
    assert initial[1]["actor/kl_loss"] > 10 * anchored[2]["actor/kl_loss"]  # the clone is far from the model
    resumed = run("resumed", resume_from_checkpoint=str(tmp_path / "anchored" / "checkpoints" / "step-00000001"))
    assert [row["step"] for row in resumed] == [2]
    for key in ("actor/kl_loss", "actor/pg_loss", "actor/log_prob"):
        assert resumed[0][key] == pytest.approx(anchored[2][key], rel=1e-5, abs=1e-8), key
    # the cached clone gone (cleared, or the code changed since the run started): the resume says it warms up again
    shutil.rmtree(tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="roll.agentic.pipeline.pipeline"):
        rebuilt = run("rebuilt", resume_from_checkpoint=str(tmp_path / "anchored" / "checkpoints" / "step-00000001"))
    assert "the warm-up cache has no entry for this config and code" in caplog.text
    assert rebuilt[0]["actor/kl_loss"] == pytest.approx(anchored[2]["actor/kl_loss"], rel=1e-5, abs=1e-8)


MODEL = "tiny://nano?seed=0"


def _role(name: str, strategy: str) -> dict[str, Any]:
    return {
        "name": name,
        "model_args": {"model_name_or_path": MODEL, "dtype": "float32"},
        "strategy_args": {"strategy_name": strategy},
    }


def _run(out: Path, **extra: Any) -> list[dict[str, Any]]:
    data = {
        "pipeline_cls": "agentic",
        "output_dir": str(out),
        "adv_estimator": "reinforce",
        "max_steps": 3,
        "eval_steps": 3,
        "save_steps": 1,
        "max_ckpt_to_keep": 3,
        "export_hf": False,
        "plots": False,
        "rollout_batch_size": 4,
        "sequence_length": 256,
        "rollout": {"env_workers": "local", "dump": True},
        "kl": {"use_loss": True, "loss_coef": 0.1},
        "warmup": {
            "steps": 1,
            "episodes_per_step": 4,
            "learning_rate": 1e-3,
            "cache": False,
            "policy": "roll.agentic.policy.mock:RandomActionPolicy",
            "policy_kwargs": {"actions": ["Up", "Down", "Left", "Right"]},
        },
        "custom_envs": {"Lake": LAKE},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["Lake"]},
        "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["Lake"]},
        "actor_train": {
            **_role("resume-train", "fsdp2_train"),
            "training_args": {"learning_rate": 1e-4, "lr_scheduler_type": "cosine"},
        },
        "reference": _role("resume-ref", "hf_infer"),
        # greedy rollouts, so that two runs from the same weights play the same episodes
        "actor_infer": {
            **_role("resume-infer", "hf_infer"),
            "generating_args": {"max_new_tokens": 8, "temperature": 0},
        },
        **extra,
    }
    run_config(load_config(data))
    return read_metrics(out / "metrics.jsonl")


def _episodes(out: Path, step: int) -> list[tuple[str, int]]:
    lines = (out / "rollouts" / f"step-{step:06d}-episodes.jsonl").read_text().splitlines()
    return sorted((row["traj_id"], row["seed"]) for row in map(json.loads, lines))


def _state(out: Path, step: int) -> dict[str, Any]:
    return json.loads((out / "checkpoints" / f"step-{step:08d}" / "pipeline_state.json").read_text())


@pytest.mark.pipeline_run
@pytest.mark.integration
def test_a_resumed_run_continues_the_uninterrupted_one(ray_env, tmp_path: Path):
    """Resuming from a checkpoint continues the uninterrupted run exactly (greedy rollouts): the same env seeds (the
    training scheduler's cursor), the same point of a decaying LR schedule, the reference on the same warmed-up clone
    (with ``warmup.cache: false`` the warm-up is played again for it), and no step logged twice."""
    register_pipelines()
    full = _run(tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoints" / "step-00000001"
    resumed = _run(tmp_path / "resumed", resume_from_checkpoint=str(checkpoint))

    assert [row["step"] for row in full] == [0, 1, 2, 3]
    assert [row["step"] for row in resumed] == [2, 3]  # nothing before the checkpoint is played or logged again
    assert _state(tmp_path / "full", 1)["data_state"]["next_episode"] == [1, 1]  # one round per group so far
    for step, row in zip((2, 3), resumed, strict=True):
        expected = full[step]
        # the scheduler's cursor: the same env seeds, in the same groups
        assert _episodes(tmp_path / "resumed", step) == _episodes(tmp_path / "full", step)
        # the LR schedule's position (cosine: the rate falls step by step)
        assert row["actor/lr"] == pytest.approx(expected["actor/lr"], rel=1e-6)
        # the reference on the same clone (the warm-up played again), the actor on the checkpoint's weights
        for key in ("actor/kl_loss", "actor/pg_loss", "actor/log_prob"):
            assert row[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-8), (step, key)
    assert full[3]["actor/lr"] < full[2]["actor/lr"] < full[1]["actor/lr"]
    assert full[2]["actor/kl_loss"] > 1e-6  # the actor moved off the clone: the KL check above has teeth
    assert resumed[-1]["val/success"] == full[-1]["val/success"]
    assert _state(tmp_path / "resumed", 3)["data_state"] == _state(tmp_path / "full", 3)["data_state"]
