"""A private local Ray and asset cache for the pipeline runs of this folder (started only when asked for)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_env(tmp_path_factory: pytest.TempPathFactory):
    from roll.runtime.testing import local_ray

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLL_CACHE_DIR", str(tmp_path_factory.mktemp("roll-cache")))
        with local_ray(num_cpus=8):
            yield


NANO = "tiny://nano?seed=0"


@pytest.fixture
def nano_rollout(ray_env, tmp_path):
    """``run(tag, env_spec, groups=, group_size=, **top)``: one step of ``agentic_rollout`` with the nano model (8 new
    tokens a turn, HF inference, envs in the driver) on ``custom_envs: {tag: env_spec}``; returns the output folder,
    its episodes and its rows (``rollouts/step-000001*.jsonl``). ``top`` adds or overrides top-level keys."""
    import json

    from roll.agentic.pipeline import register_pipelines
    from roll.pipelines.config import load_config
    from roll.pipelines.launcher import run_config

    def run(tag: str, env_spec: dict, *, groups: int, group_size: int, **top):
        register_pipelines()
        out = tmp_path / "out"
        data = {
            "pipeline_cls": "agentic_rollout",
            "output_dir": str(out),
            "max_steps": 1,
            "plots": False,
            "rollout_batch_size": groups * group_size,
            "sequence_length": 1024,
            "rollout": {"env_workers": "local"},
            "custom_envs": {tag: env_spec},
            "train_env_manager": {"num_env_groups": groups, "group_size": group_size, "tags": [tag]},
            "actor_infer": {
                "name": f"{tag.lower()}-infer",
                "model_args": {"model_name_or_path": NANO, "dtype": "float32"},
                "strategy_args": {"strategy_name": "hf_infer"},
                "generating_args": {"max_new_tokens": 8},
            },
            **top,
        }
        run_config(load_config(data))
        folder = out / "rollouts"
        episodes = [json.loads(line) for line in (folder / "step-000001-episodes.jsonl").open()]
        rows = [json.loads(line) for line in (folder / "step-000001.jsonl").open()]
        return out, episodes, rows

    return run
