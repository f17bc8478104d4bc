"""``roll validate`` finds, without starting workers or Ray, what would fail at run time: a backend whose extra is
missing, unknown or uninstalled trackers, unknown reward types and prompts without the fields their reward needs,
models and tokenizers that do not load (hub ids from the offline cache), device ids beyond the declared cluster."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import ray

from roll.pipelines import tracking
from roll.pipelines.cli import main
from roll.strategies.testing import make_tiny_causal_lm

RECIPE = "rlvr-rollout-tiny"
SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None


@pytest.fixture(autouse=True)
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / "roll-cache"))
    monkeypatch.setenv("ROLL_DATA_CACHE", str(tmp_path / "roll-data"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny") / "model", preset="nano", seed=0)


def validate(capsys: pytest.CaptureFixture[str], *overrides: str, here: bool = False) -> tuple[int, str, str]:
    """``roll validate RECIPE overrides --no-ray``; ``here=True`` drops --no-ray (this machine is the run's: what it
    lacks is an error; the Ray cluster is checked only when nothing else failed, so failing cases start no Ray)."""
    code = main(["validate", RECIPE, *overrides, *([] if here else ["--no-ray"])])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_valid_config_passes_without_starting_ray(capsys, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("roll validate --no-ray started Ray")

    was_up = ray.is_initialized()  # another test file in the same session may have started it
    # Imported before the patch: it binds roll.runtime.init at import time, and a first import under the patch kept
    # the patched function for the rest of the session (a later test's pipeline then "started Ray" here).
    import roll.pipelines.base  # noqa: F401

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr("roll.runtime.init", no_ray)
    code, out, err = validate(capsys)
    assert code == 0, err
    assert f"OK: {RECIPE} is a valid rlvr_rollout config" in out
    assert "actor_infer: 1 worker(s), hf_infer, CPU" in out
    assert "rewards: math=math; prompts checked for their fields (32 train, 16 eval)" in out
    assert ray.is_initialized() == was_up


def test_many_cpu_workers_on_few_cores_get_a_warning_naming_the_largest_roles(capsys, monkeypatch):
    # a ROLL GPU file's 16 reward workers per domain, brought to a 2-core laptop: each worker is a process
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    code, out, err = validate(capsys, "rewards.math.world_size=16")
    assert code == 0, err
    assert (
        "warning: 17 worker processes on this machine's 2 CPU cores (rewards.math 16, actor_infer 1): each is a "
        "process of its own, so start-up and steps slow down; lower the largest, e.g. rewards.math.world_size=1"
    ) in out
    code, out, err = validate(capsys, "rewards.math.world_size=7")  # 8 processes: up to 4 per core is quiet
    assert code == 0 and "worker processes" not in out
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # a cluster's nodes have cores of their own
    code, out, err = validate(capsys, "rewards.math.world_size=16")
    assert code == 0 and "worker processes" not in out


@pytest.mark.skipif(SGLANG_INSTALLED, reason="checks the error for a machine without SGLang")
def test_a_backend_whose_extra_is_missing_fails_with_the_pip_command(capsys):
    ray_was_up = ray.is_initialized()
    code, _, err = validate(capsys, "actor_infer.strategy_args.strategy_name=sglang", here=True)
    assert code == 2
    # the role's field is named (several roles, e.g. a ROLL file's teachers, may name one backend), and its fix
    where = "actor_infer.strategy_args.strategy_name"
    assert f"strategy 'sglang' ({where}) needs an optional dependency that is not installed" in err
    assert "pip install 'roll-strategies[sglang]'" in err
    assert f"or set {where} to a strategy installed here" in err
    assert not ray.is_initialized() or ray_was_up
    # Away from the run's machine (--no-ray), what this machine lacks is a warning.
    code, out, err = validate(capsys, "actor_infer.strategy_args.strategy_name=sglang")
    assert code == 0, err
    assert f"warning: strategy 'sglang' ({where}) needs an optional dependency" in out


def test_an_unknown_tracker_fails_with_the_closest_name(capsys):
    code, _, err = validate(capsys, "track_with=[console, swanlab-typo]")
    assert code == 2
    assert "unknown tracker 'swanlab-typo' (did you mean 'swanlab'?)" in err


def test_a_tracker_without_its_package_fails_with_the_pip_command(capsys, monkeypatch):
    monkeypatch.setitem(tracking.TRACKER_MODULES, "wandb", "roll_test_not_installed_wandb")
    code, _, err = validate(capsys, "track_with=[wandb]", here=True)
    assert code == 2
    assert "tracker 'wandb' needs an optional dependency" in err
    assert "pip install 'roll-pipelines[wandb]'" in err


def test_an_unknown_reward_type_fails(capsys):
    code, _, err = validate(capsys, "rewards.math.reward_type=mth")
    assert code == 2
    assert "unknown reward_type 'mth'" in err


def test_prompts_without_the_field_their_reward_needs_fail(capsys):
    code, _, err = validate(capsys, "actor_infer.data_args.extra_keys=[]")
    assert code == 2
    assert "reward domain 'math' (math) needs a 'ground_truth' field, but prompt 0 has only" in err
    assert "actor_infer.data_args.extra_keys" in err


def test_a_model_folder_that_does_not_load_fails(capsys, tmp_path, tiny_model):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    code, _, err = validate(capsys, f"actor_infer.model_args.model_name_or_path={empty}")
    assert code == 2
    assert f"actor_infer.model_args.model_name_or_path: {empty} holds no loadable model config" in err
    # A loadable model whose tokenizer folder has no tokenizer.
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text((tiny_model / "config.json").read_text())
    code, _, err = validate(
        capsys,
        f"actor_infer.model_args.model_name_or_path={tiny_model}",
        f"actor_infer.model_args.tokenizer_name_or_path={no_tokenizer}",
    )
    assert code == 2
    assert f"actor_infer.model_args.tokenizer_name_or_path: {no_tokenizer} holds no loadable tokenizer" in err
    code, _, err = validate(capsys, f"actor_infer.model_args.model_name_or_path={tiny_model}")
    assert code == 0, err


def test_hub_ids_are_checked_in_the_offline_cache(capsys, hub_cache, tiny_model):
    hub_cache("roll-test/tiny", tiny_model)
    code, out, err = validate(capsys, "actor_infer.model_args.model_name_or_path=roll-test/tiny")
    assert code == 0, err
    assert "HF_HUB_OFFLINE is set" in out
    code, _, err = validate(capsys, "actor_infer.model_args.model_name_or_path=roll-test/missing", here=True)
    assert code == 2
    assert "'roll-test/missing' is not in the Hugging Face cache" in err
    assert str(hub_cache.cache) in err


def test_device_ids_beyond_the_declared_cluster_fail(capsys):
    code, _, err = validate(
        capsys,
        "num_nodes=1",
        "num_gpus_per_node=2",
        "actor_infer.device_mapping=[0,1,2,3]",
        "actor_infer.world_size=4",
    )
    assert code == 2
    assert "actor_infer.device_mapping uses device ids [2, 3], but num_nodes=1 x num_gpus_per_node=2" in err


def test_a_device_mapping_with_no_gpus_declared_names_the_cpu_settings(capsys):
    code, _, err = validate(
        capsys, "num_gpus_per_node=0", "actor_infer.device_mapping=[0,1]", "actor_infer.world_size=2"
    )
    assert code == 2
    assert (
        "actor_infer.device_mapping is set, but num_gpus_per_node=0 declares no GPUs: to run actor_infer on CPU "
        "workers, set actor_infer.device_mapping=null and actor_infer.world_size (its number of workers)"
    ) in err


def test_an_fsdp_shard_group_that_does_not_divide_the_workers_names_the_field_and_the_fix(capsys):
    # ROLL's FSDP2 files shard over 8 GPUs (fsdp_size: 8); on 2 CPU workers the worker's mesh would fail at start
    code = main(
        ["validate", "sft-tiny", "sft_train.world_size=2", "sft_train.strategy_args.strategy_config.fsdp_size=8"]
    )
    _, err = capsys.readouterr()
    assert code == 2
    assert (
        "sft_train.strategy_args.strategy_config.fsdp_size=8 must divide sft_train's world size 2 (parameters are "
        "sharded over fsdp_size workers and replicated across the groups); set "
        "sft_train.strategy_args.strategy_config.fsdp_size to a divisor of 2 or null (shard over every worker), or "
        "set sft_train.world_size"
    ) in err
    assert (
        main(
            [
                "validate",
                "sft-tiny",
                "sft_train.world_size=2",
                "sft_train.strategy_args.strategy_config.fsdp_size=2",
                "--no-ray",
            ]
        )
        == 0
    )


@pytest.mark.parametrize(
    ("recipe", "role", "row", "missing"),
    [
        ("sft-tiny", "sft_train", {"prompt": "1 + 1 =", "output": "2"}, "response"),
        ("dpo-tiny", "actor_train", {"instruction": "1 + 1 =", "chosen": "2", "rejected": "3"}, "prompt"),
        ("distill-tiny", "student", {"question": "1 + 1 =", "response": "2"}, "prompt"),
    ],
)
def test_data_rows_without_a_column_the_pipeline_reads_fail_before_the_run(
    capsys, tmp_path, recipe, role, row, missing
):
    # they used to pass roll validate and stop the run at its start
    data = tmp_path / "rows.json"
    data.write_text(json.dumps([row, row]))
    files = [f"{role}.data_args.file_name={data}", f"{role}.data_args.eval_file_name=null"]
    assert main(["validate", recipe, *files, "--no-ray"]) == 2
    err = capsys.readouterr().err
    assert f"{data} row 0: missing key {missing!r}" in err and f"set data_args.{missing}_key or fix the row" in err
    fixed = {**row, missing: "2"}
    data.write_text(json.dumps([fixed, fixed]))
    assert main(["validate", recipe, *files, "--no-ray"]) == 0
    assert f"{role}.data_args: rows checked for their columns (2 train)" in capsys.readouterr().out


def test_flash_attention_without_its_package_names_the_field_and_the_fix(capsys, monkeypatch):
    """A ROLL file's ``attn_implementation: fa2`` on a machine without flash-attn failed in every worker's model
    load, after Ray and the clusters had started (transformers' ImportError); now ``roll validate`` names the role's
    field and the fix, and the backends that load with transformers say so before loading."""
    from roll.strategies import registry

    monkeypatch.setattr(registry, "_module_installed", lambda name: name != "flash_attn")
    code, _, err = validate(capsys, "actor_infer.model_args.attn_implementation=flash_attention_2", here=True)
    assert code == 2
    assert (
        "actor_infer.model_args.attn_implementation='flash_attention_2' needs the 'flash_attn' module (flash-attn, "
        "which builds for CUDA GPUs only), not installed here: install it where the workers run, or set "
        "actor_infer.model_args.attn_implementation to sdpa"
    ) in err
    code, out, err = validate(capsys, "actor_infer.model_args.attn_implementation=flash_attention_2")
    assert code == 0, err  # away from the run's machine (--no-ray): a warning
    assert "warning: actor_infer.model_args.attn_implementation='flash_attention_2' needs" in out
    # vLLM picks its own kernels: the setting is not read there
    code, out, err = validate(
        capsys,
        "actor_infer.model_args.attn_implementation=flash_attention_2",
        "actor_infer.strategy_args.strategy_name=vllm",
    )
    assert "attn_implementation" not in out + err


def test_run_warns_of_a_package_this_machine_lacks_before_it_starts_ray(capsys, monkeypatch):
    """``roll run`` repeats validate's package checks before Ray starts, as warnings: a driver may lack what the
    workers' nodes have (flash-attn on a CPU head node), and a run whose workers lack it too fails at their model
    load after the clusters have started."""
    from roll.pipelines import launcher
    from roll.strategies import registry

    class Started(Exception):
        pass

    def start(config):
        raise Started(config.actor_infer.model_args.attn_implementation)

    monkeypatch.setattr(registry, "_module_installed", lambda name: name != "flash_attn")
    monkeypatch.setattr(launcher, "run_config", start)
    with pytest.raises(Started, match="flash_attention_2"):
        main(["run", RECIPE, "actor_infer.model_args.attn_implementation=flash_attention_2"])
    err = capsys.readouterr().err
    assert (
        "warning: actor_infer.model_args.attn_implementation='flash_attention_2' needs the 'flash_attn' module"
    ) in err
    assert err.rstrip().endswith("(checked on this machine, not on the workers' nodes)")
    with pytest.raises(Started, match="sdpa"):
        main(["run", RECIPE, "actor_infer.model_args.attn_implementation=sdpa"])
    assert "warning" not in capsys.readouterr().err


def test_every_problem_is_reported_at_once(capsys, tmp_path, hub_cache):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1?", "tag": "math"}) + "\n")
    code, _, err = validate(
        capsys,
        "track_with=[console]",
        "actor_infer.model_args.model_name_or_path=roll-test/missing-too",
        f"actor_infer.data_args.file_name={data}",
        "actor_infer.data_args.eval_file_name=null",
        "actor_infer.data_args.extra_keys=[]",
        here=True,
    )
    assert code == 2
    assert "2 problems found:" in err
    assert "roll-test/missing-too" in err and "needs a 'ground_truth' field" in err


def _spanning(strategy: str, per_node: int, mapping: str, size: int) -> list[str]:
    key = "tensor_parallel_size" if strategy == "vllm" else "tp_size"
    return [
        "num_nodes=2",
        f"num_gpus_per_node={per_node}",
        f"actor_infer.device_mapping={mapping}",
        f"actor_infer.strategy_args.strategy_name={strategy}",
        f"actor_infer.strategy_args.strategy_config.{key}={size}",
    ]


@pytest.mark.parametrize("strategy", ["vllm", "sglang"])
def test_a_worker_spanning_nodes_passes_when_its_engine_runs_over_nodes(capsys, strategy):
    code, out, err = validate(capsys, *_spanning(strategy, 2, "[1,2]", 2))
    assert code == 0, err
    assert "actor_infer: 1 of 1 worker(s) run one engine over 2 nodes" in out


def test_a_worker_spanning_nodes_fails_when_its_backend_runs_on_one_node(capsys, monkeypatch):
    from roll.strategies.vllm.config import VllmConfig

    monkeypatch.setattr(VllmConfig, "multi_node_engine", False)  # a backend without the capability
    code, _, err = validate(capsys, *_spanning("vllm", 2, "[1,2]", 2))
    assert code == 2
    assert "actor_infer rank 0 would span nodes [0, 1] with devices [1, 2]" in err
    assert "at most 2 devices" in err
    assert "strategy 'vllm' runs a worker's devices on one node; backends whose engine spans nodes: sglang" in err


def test_an_sglang_engine_over_nodes_needs_the_same_devices_on_each(capsys):
    code, _, err = validate(capsys, *_spanning("sglang", 4, "[1,2,3,4]", 4))
    assert code == 2
    assert "actor_infer: an sglang engine over 2 nodes needs the same number of devices on each node" in err
    assert "split [3, 1]" in err
